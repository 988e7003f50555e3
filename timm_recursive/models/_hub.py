"""Offline without waiting: ask the Hugging Face Hub once, briefly, before the first download.

With no network, huggingface_hub retries each request with backoff (``Retrying in 8s [Retry 5/5]``), so
a training on a machine without internet spent 30-50 s before it fell back to local files. Before the
first Hub request of a process, ``go_offline_if_hub_unreachable`` opens one connection to the Hub's
endpoint with a short timeout; if it fails, it says so in one line and switches huggingface_hub and
datasets to their offline mode (cache and local files only), as ``HF_HUB_OFFLINE=1`` would have from the
start. With ``HF_HUB_OFFLINE=1`` set, nothing is asked.
"""
import logging
import os
import sys
from typing import Optional

__all__ = ['go_offline_if_hub_unreachable', 'HUB_CHECK_TIMEOUT_S']

HUB_CHECK_TIMEOUT_S = 3.0
_logger = logging.getLogger('timm_recursive')
_checked = False


def _hub_answers(endpoint: str, timeout: float) -> bool:
    """Whether ``endpoint`` answers an HTTP request at all (any status: a 404 still means it is reachable),
    through the proxies huggingface_hub's session honours, without its retries."""
    from huggingface_hub.utils import get_session
    try:
        get_session().head(endpoint, timeout=timeout)
    except Exception:  # DNS failure, refused, timed out, proxy down: unreachable, whatever the transport says
        return False
    return True


def go_offline_if_hub_unreachable(timeout: Optional[float] = None) -> bool:
    """True when working offline: ``HF_HUB_OFFLINE`` was set, or the Hub did not answer within ``timeout``
    seconds (``HUB_CHECK_TIMEOUT_S``; checked once per process; then offline mode is switched on, with a
    one-line note)."""
    global _checked
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return True
    if _checked:
        return False
    _checked = True
    timeout = HUB_CHECK_TIMEOUT_S if timeout is None else timeout
    if _hub_answers(constants.ENDPOINT, timeout):
        return False
    _logger.warning('note: the Hugging Face Hub (%s) did not answer within %g s: working offline from the local '
                    'cache and files (set HF_HUB_OFFLINE=1 to skip this check)', constants.ENDPOINT, timeout)
    os.environ['HF_HUB_OFFLINE'] = '1'  # child processes, and libraries imported later
    constants.HF_HUB_OFFLINE = True
    if 'datasets' in sys.modules:  # datasets copies the flag into its own config when it is imported
        sys.modules['datasets'].config.HF_HUB_OFFLINE = True
    return True
