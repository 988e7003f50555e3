"""Markdown whose numbers are generated from saved results, so a table cannot drift from its data.

A Markdown file marks each generated piece with a pair of HTML comments, which GitHub and the Hub
do not render::

    <!-- gen: recursion_refinement/variants -->
    | variant | top-1 (%) |
    | --- | --- |
    | DSA-MoE | 78.10 |
    <!-- /gen -->

    The last step reaches <!-- gen: recursion_refinement/headline -->78.10%<!-- /gen --> ...

The key is ``<study>/<name>``: ``experiments/<study>/tables.py`` defines
``tables(results: pathlib.Path) -> dict[str, str]``, which reads that study's ``results/`` folder and
returns each piece by name (a multi-line table, or a one-line value for prose). Inside a study's own
README the study may be left out (``<!-- gen: variants -->``). Pieces that span studies (the README's
results table) come from ``experiments/tables.py``, whose ``tables(experiments: pathlib.Path)`` is
keyed ``experiments/<name>`` and may read other studies through ``load_study_tables``.
``experiments/render.py`` rewrites
every marked piece in README.md, docs/ and experiments/; ``--check`` fails on any difference.
"""
import importlib.util
import pathlib
import re
from typing import Callable, Dict, List, Optional

from timm_recursive.analysis.markdown import markdown_table, pct

__all__ = ['GeneratedMarkdownError', 'Repository', 'import_file', 'load_study_tables', 'markdown_table', 'pct',
           'render', 'tables_outside_generated_blocks']

GEN_BLOCK = re.compile(r'<!-- gen: *(?P<key>[\w./-]+) *-->(?P<body>.*?)<!-- /gen -->', re.DOTALL)
# a Markdown table row: starts with a pipe after optional indentation
TABLE_ROW = re.compile(r'^\s*\|')


class GeneratedMarkdownError(ValueError):
    """A marker names a study or piece that does not exist, or markers are unbalanced."""


def import_file(module_path: pathlib.Path):
    """Import a study's script (``tables.py``, ``run.py``: files, not part of a package) as a module."""
    spec = importlib.util.spec_from_file_location(f'{module_path.parent.name}_{module_path.stem}', module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_tables_module(module_path: pathlib.Path, argument: pathlib.Path) -> Dict[str, str]:
    pieces = import_file(module_path).tables(argument)
    for name, text in pieces.items():
        if not isinstance(text, str):
            raise GeneratedMarkdownError(f'{module_path}: piece {name!r} is {type(text).__name__}, not str')
    return pieces


def load_study_tables(study_dir: pathlib.Path) -> Dict[str, str]:
    """Run ``<study_dir>/tables.py``'s ``tables()`` on ``<study_dir>/results``."""
    return _run_tables_module(study_dir / 'tables.py', study_dir / 'results')


def render(text: str, lookup: Callable[[str], str], default_study: Optional[str] = None) -> str:
    """Replace the body of every ``gen`` block of ``text`` with ``lookup(key)``."""
    opened, closed = text.count('<!-- gen:'), text.count('<!-- /gen -->')
    if not opened == closed == len(GEN_BLOCK.findall(text)):
        raise GeneratedMarkdownError('unbalanced <!-- gen: --> / <!-- /gen --> markers')

    def replace(match: 're.Match') -> str:
        key = match['key']
        if '/' not in key:
            if default_study is None:
                raise GeneratedMarkdownError(f'marker {key!r} needs its study: <!-- gen: <study>/{key} -->')
            key = f'{default_study}/{key}'
        body = lookup(key)
        if '\n' in body:
            body = f'\n{body}\n'
        return f'<!-- gen: {match["key"]} -->{body}<!-- /gen -->'

    return GEN_BLOCK.sub(replace, text)


def tables_outside_generated_blocks(text: str) -> List[int]:
    """1-based line numbers of Markdown table rows that no ``gen`` block produced.

    A table of specifications rather than measurements (model configurations, option lists) is
    allowed when the line right before it says so: ``<!-- specification table -->``.
    """
    inside = set()
    for match in GEN_BLOCK.finditer(text):
        first = text.count('\n', 0, match.start()) + 1
        last = text.count('\n', 0, match.end()) + 1
        inside.update(range(first, last + 1))
    lines = text.split('\n')
    stray, allowed = [], False
    for number, line in enumerate(lines, start=1):
        if TABLE_ROW.match(line):
            if number not in inside and not allowed:
                stray.append(number)
        else:
            allowed = line.strip() == '<!-- specification table -->'
    return stray


class Repository:
    """The Markdown of a checkout and the tables of its studies (loaded once each, on demand)."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.experiments = root / 'experiments'
        self._pieces: Dict[str, Dict[str, str]] = {}

    def studies(self) -> List[str]:
        return sorted(p.parent.name for p in self.experiments.glob('*/tables.py'))

    def markdown_files(self) -> List[pathlib.Path]:
        files = [self.root / 'README.md'] + sorted((self.root / 'docs').rglob('*.md'))
        files += sorted(self.experiments.glob('*.md')) + sorted(self.experiments.glob('*/README.md'))
        return [f for f in files if f.exists()]

    def lookup(self, key: str) -> str:
        study, _, name = key.partition('/')
        if study not in self._pieces:
            study_dir = self.experiments / study
            if study == 'experiments' and (self.experiments / 'tables.py').exists():
                self._pieces[study] = _run_tables_module(self.experiments / 'tables.py', self.experiments)
            elif (study_dir / 'tables.py').exists():
                self._pieces[study] = load_study_tables(study_dir)
            else:
                raise GeneratedMarkdownError(f'no study {study!r}: {study_dir}/tables.py does not exist')
        pieces = self._pieces[study]
        if name not in pieces:
            raise GeneratedMarkdownError(
                f'study {study!r} has no piece {name!r} (it has: {", ".join(sorted(pieces))})')
        return pieces[name]

    def render_file(self, path: pathlib.Path) -> str:
        if path.parent == self.experiments:
            default_study = 'experiments'
        elif path.parent.parent == self.experiments:
            default_study = path.parent.name
        else:
            default_study = None
        try:
            return render(path.read_text(), self.lookup, default_study)
        except GeneratedMarkdownError as e:
            raise GeneratedMarkdownError(f'{path.relative_to(self.root)}: {e}') from None
