#!/usr/bin/env python3
"""Regenerate every table and figure-in-prose of README.md, docs/ and experiments/ from the studies' JSON, and the
model cards from their run records (model_cards/runs/, see tools/model_cards.py).

    python experiments/render.py          # rewrite the marked pieces in place
    python experiments/render.py --check  # exit 1 and name each file whose pieces differ from its data

Each study's ``tables.py`` reads its own ``results/`` (see tools/generated_markdown.py).
"""
import argparse
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's tools/
from tools import model_cards  # noqa: E402
from tools.generated_markdown import GeneratedMarkdownError, Repository  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def write_atomically(path: pathlib.Path, text: str) -> None:
    with tempfile.NamedTemporaryFile('w', dir=path.parent, delete=False, suffix='.tmp') as f:
        f.write(text)
    os.replace(f.name, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument('--check', action='store_true', help='change nothing; exit 1 if any piece is stale')
    parser.add_argument('--root', type=pathlib.Path, default=ROOT, help='the checkout (default: this one)')
    args = parser.parse_args(argv)
    repo = Repository(args.root)
    stale = []
    try:
        for path in repo.markdown_files():
            text = path.read_text()
            rendered = repo.render_file(path)
            if rendered != text:
                stale.append(path.relative_to(args.root))
                if not args.check:
                    write_atomically(path, rendered)
    except GeneratedMarkdownError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    for path in stale:
        print(f'{"stale" if args.check else "rewrote"}: {path}')
    # the model cards, rendered from the run records beside them (this checkout's only)
    card_problems = model_cards.stale(rewrite=not args.check) if args.root.resolve() == ROOT else []
    for problem in card_problems:
        print(f'stale: {problem}')
    return 1 if (args.check and stale) or card_problems else 0


if __name__ == '__main__':
    sys.exit(main())
