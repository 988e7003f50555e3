"""Every table in README.md, docs/ and experiments/ is generated from a study's committed results."""
import json
import pathlib
import subprocess
import sys

import pytest

from tools.generated_markdown import (
    GeneratedMarkdownError,
    Repository,
    import_file,
    markdown_table,
    render,
    tables_outside_generated_blocks,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
RENDER = ROOT / 'experiments' / 'render.py'
render_command = import_file(RENDER)


def _fake_checkout(tmp_path, readme_body):
    study = tmp_path / 'experiments' / 'toy'
    (study / 'results').mkdir(parents=True)
    (study / 'results' / 'run.json').write_text(json.dumps({'top1': 81.234}))
    (study / 'tables.py').write_text(
        'import json\n'
        'from tools.generated_markdown import markdown_table\n'
        'def tables(results):\n'
        '    top1 = json.loads((results / "run.json").read_text())["top1"]\n'
        '    return {"main": markdown_table(["model", "top-1 (%)"], [["toy", f"{top1:.2f}"]]),\n'
        '            "headline": f"{top1:.1f}%"}\n')
    (study / 'README.md').write_text('# toy\n<!-- gen: main -->\nstale\n<!-- /gen -->\n')
    (tmp_path / 'README.md').write_text(readme_body)
    return tmp_path


def test_markdown_table_checks_its_rows():
    assert markdown_table(['a', 'b'], [[1, 2]]) == '| a | b |\n| --- | --- |\n| 1 | 2 |'
    with pytest.raises(ValueError, match='3 cells for 2 columns'):
        markdown_table(['a', 'b'], [[1, 2, 3]])


def test_render_fills_blocks_and_inline_values():
    text = 'x <!-- gen: s/v -->old<!-- /gen --> y\n<!-- gen: t -->\nold\n<!-- /gen -->\n'
    pieces = {'s/v': '1.5%', 's/t': '| a |\n| --- |'}
    out = render(text, pieces.__getitem__, default_study='s')
    assert out == 'x <!-- gen: s/v -->1.5%<!-- /gen --> y\n<!-- gen: t -->\n| a |\n| --- |\n<!-- /gen -->\n'
    assert render(out, pieces.__getitem__, default_study='s') == out


@pytest.mark.parametrize('text, message', [
    ('<!-- gen: a/b -->', 'unbalanced'),
    ('<!-- gen: b -->x<!-- /gen -->', 'needs its study'),
])
def test_render_refuses_bad_markers(text, message):
    with pytest.raises(GeneratedMarkdownError, match=message):
        render(text, lambda key: '', default_study=None)


def test_tables_outside_generated_blocks_are_found():
    text = ('| a |\n| --- |\n\n<!-- gen: s/t -->\n| b |\n<!-- /gen -->\n'
            '<!-- specification table -->\n| c |\n| --- |\n')
    assert tables_outside_generated_blocks(text) == [1, 2]


def test_render_command_rewrites_then_checks(tmp_path, capsys):
    root = _fake_checkout(tmp_path, 'top-1 <!-- gen: toy/headline -->?<!-- /gen -->\n')
    command = ['--root', str(root)]
    assert render_command.main(command + ['--check']) == 1 and 'stale: README.md' in capsys.readouterr().out
    assert render_command.main(command) == 0
    assert (root / 'README.md').read_text() == 'top-1 <!-- gen: toy/headline -->81.2%<!-- /gen -->\n'
    assert '| toy | 81.23 |' in (root / 'experiments' / 'toy' / 'README.md').read_text()
    assert render_command.main(command + ['--check']) == 0


def test_render_command_names_an_unknown_piece(tmp_path, capsys):
    root = _fake_checkout(tmp_path, '<!-- gen: toy/nope -->?<!-- /gen -->\n')
    assert render_command.main(['--root', str(root), '--check']) == 2
    assert capsys.readouterr().err.strip() == (
        "error: README.md: study 'toy' has no piece 'nope' (it has: headline, main)")


@pytest.mark.slow
def test_every_generated_piece_matches_its_data():
    result = subprocess.run([sys.executable, str(RENDER), '--check'], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_table_is_generated_or_declared_a_specification():
    repo = Repository(ROOT)
    stray = {str(path.relative_to(ROOT)): lines for path in repo.markdown_files()
             if (lines := tables_outside_generated_blocks(path.read_text()))}
    assert not stray, f'Markdown tables not generated from results (file: lines): {stray}'


# the repository folders whose paths the pages name in backticks
REPOSITORY_PREFIXES = ('timm_recursive/', 'experiments/', 'tools/', 'benchmarks/', 'train_scripts/', 'scripts/',
                       'tests/', 'docs/', 'model_cards/', '.ci/')


def test_every_repository_path_the_pages_name_exists():
    """Backticked repository paths (``timm_recursive/train/dino.py``) and relative links of README.md, docs/ and
    the study READMEs point at files that exist; placeholders (``<study>``, ``*``, ``{...}``) are skipped."""
    import re
    pages = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md')), *sorted((ROOT / 'experiments').glob('*.md')),
             *sorted((ROOT / 'experiments').glob('*/README.md'))]
    missing = []
    for page in pages:
        text = page.read_text()
        for match in re.finditer(r'`([^`\s]+)`', text):
            path = match.group(1).rstrip('.,:;)').split('::')[0].split(':')[0]
            if path.startswith(REPOSITORY_PREFIXES) and not re.search(r'[<>*{}$]|\.\.\.', path) \
                    and not (ROOT / path).exists():
                missing.append(f'{page.relative_to(ROOT)}: {path}')
        for match in re.finditer(r'\]\(([^)\s#]+)', text):
            target = match.group(1)
            if not target.startswith(('http:', 'https:', 'mailto:')) and not (page.parent / target).exists():
                missing.append(f'{page.relative_to(ROOT)}: link {target}')
    assert not missing, missing


# the words that would make a page speak of how the project is run rather than of the project
OUTSIDE_WORDS = r'\bissues?\b|\bworkspace\b|\.\./shared|\blent\b|\bseed 00\d\b'
TEXT_SUFFIXES = {'.md', '.py', '.sh', '.yaml', '.toml', '.j2', '.txt', '.cfg'}


def test_the_repository_speaks_only_of_the_project():
    """No page, card template, comment or message mentions a tracker issue, the workspace around the checkout,
    seed files or borrowed hardware: a reader of the repository meets only the project."""
    import re
    listed = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip('not a git checkout')
    found = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if (path.suffix in TEXT_SUFFIXES or path.name in {'Makefile', 'run'}) and path.is_file() \
                and path != pathlib.Path(__file__):
            for number, line in enumerate(path.read_text(errors='replace').splitlines(), 1):
                if re.search(OUTSIDE_WORDS, line, re.IGNORECASE):
                    found.append(f'{name}:{number}: {line.strip()[:100]}')
    assert not found, found


def readme_sentences(text: str):
    """The README's prose sentences as a reader sees them: fenced code, tables, headings and generated markers left
    out, links read as their text, a paragraph's or list item's lines joined, split after a full stop, question or
    exclamation mark that ends a sentence."""
    import re
    text = re.sub(r'^```.*?^```', '', text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)
    prose = [line for line in text.splitlines() if not line.lstrip().startswith(('|', '#', '<!--'))]
    sentences = []
    for paragraph in re.split(r'\n\s*\n|\n(?=- )', '\n'.join(prose)):
        sentences += re.split(r'(?<=[.!?])\s+(?=[A-Z`*(\[])', ' '.join(paragraph.split()))
    return [sentence for sentence in sentences if sentence]


def test_the_readme_reads_in_five_minutes():
    """A newcomer's README: short, no sentence over 400 characters, the results table's cells short and free of
    internal names (a study's cell names and code live in its own README)."""
    import re
    text = (ROOT / 'README.md').read_text()
    assert len(text.splitlines()) <= 250
    long = [sentence for sentence in readme_sentences(text) if len(sentence) > 400]
    assert not long, long
    results = re.search(r'<!-- gen: experiments/results -->(.*?)<!-- /gen -->', text, re.DOTALL).group(1)
    for row in results.strip().splitlines()[2:]:
        for cell in row.strip('| ').split(' | '):
            shown = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', cell)  # a link reads as its text
            assert len(shown) <= 150, shown
        assert '`' not in row.split(' | ')[-1], row  # the result: words, no code names
    # the first number a reader meets for the flagship: the zoo's, its epoch chosen on held-out images
    first_result = results.strip().splitlines()[2]
    assert 'fashion_mnist_zoo' in first_result


def test_readme_sentences_are_split_where_a_reader_stops():
    text = ('One. Two is `x.y` long.\n\n```bash\nmake test. Not prose.\n```\n| a. | b. |\n# Head. Line\nThree\nfour?\n'
            '- A [link](docs/a.md) item\n  goes on.\n- Another')
    assert readme_sentences(text) == ['One.', 'Two is `x.y` long.', 'Three four?', '- A link item goes on.',
                                      '- Another']
