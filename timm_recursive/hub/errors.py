"""The one error of the Hub export and upload."""

__all__ = ['HubError']


class HubError(RuntimeError):
    """An export or upload that failed, with what and why; local files are left in place."""
