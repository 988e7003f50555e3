"""Markdown tables as the analysis commands print them (``--markdown``) and the studies' generated pieces."""
from typing import Iterable, Optional, Sequence

__all__ = ['markdown_table', 'pct']


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; cells are written with ``str``."""
    lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f'row {list(row)} has {len(row)} cells for {len(header)} columns')
        lines.append('| ' + ' | '.join(str(cell) for cell in row) + ' |')
    return '\n'.join(lines)


def pct(value: Optional[float], digits: int = 2) -> str:
    """A percentage figure as the tables print it; a missing value is an em dash, never a guess."""
    return '—' if value is None else f'{value:.{digits}f}'
