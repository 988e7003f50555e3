"""``DatasetError``: the error of a dataset, a file or an argument the data package cannot use, saying what
is wrong and where it looked; ``_first_line`` quotes a library's error in one."""


class DatasetError(ValueError):
    """A dataset that cannot be used, with what is wrong and where it was looked for."""


def _first_line(error: Exception) -> str:
    return (str(error).strip() or type(error).__name__).splitlines()[0]
