"""model_cards/: the rendered cards of the checkpoints trained here, each beside the run records it is rendered from.

``model_cards/runs/<arch.tag>/`` holds a run's ``args.json``, ``summary.json`` and ``metrics.jsonl``, the
exported ``config.json`` (input size, mean and std as users load them) and ``card.json`` (the repo id and
which weights, ``best`` or ``last``). ``render`` makes the card from those records alone: the model is built
from the run's arguments without weights, since a card reads only its architecture. ``stale`` lists every
card that differs from its rendering, and every relative link of ``model_cards/`` that leads nowhere:
``experiments/render.py --check`` fails on either.

    python tools/model_cards.py save RUN HUB_FOLDER ARCH.TAG --repo-id ID --weights best|last
    (after `timm-recursive push-to-hub RUN --repo-id ID --weights ... --dry-run` wrote HUB_FOLDER)
"""
import argparse
import json
import pathlib
import re
import shutil
import sys
from typing import List

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CARDS = ROOT / 'model_cards'
RECORDS = ('args.json', 'summary.json', 'metrics.jsonl')
LINK = re.compile(r'\]\((?!https?://|#|mailto:)([^)\s]+)\)')


def save(run_dir: pathlib.Path, hub_folder: pathlib.Path, name: str, repo_id: str, weights: str) -> None:
    """Copy a run's records and its Hub folder's config and card to ``model_cards/``."""
    records = CARDS / 'runs' / name
    records.mkdir(parents=True, exist_ok=True)
    for file in RECORDS:
        shutil.copyfile(run_dir / file, records / file)
    config = json.loads((hub_folder / 'config.json').read_text())
    (records / 'card.json').write_text(json.dumps({'repo_id': repo_id, 'weights': weights}) + '\n')
    (records / 'config.json').write_text(json.dumps({'pretrained_cfg': config['pretrained_cfg']}, indent=2) + '\n')
    shutil.copyfile(hub_folder / 'README.md', CARDS / f'{name}.md')


def render(name: str) -> str:
    """The card of ``model_cards/runs/<name>/``, rendered from its records."""
    import timm_recursive  # noqa: F401  registers the models
    from timm_recursive.hub.export import render_run_card
    from timm_recursive.runs import create_model_from_run_args, load_run

    records = CARDS / 'runs' / name
    run = load_run(str(records))
    card = json.loads((records / 'card.json').read_text())
    cfg = json.loads((records / 'config.json').read_text())['pretrained_cfg']
    model = create_model_from_run_args(run['args'])
    return render_run_card(model, run, card['weights'], card['repo_id'], cfg)


def broken_links() -> List[str]:
    broken = []
    for page in sorted(CARDS.glob('*.md')):
        for target in LINK.findall(page.read_text()):
            if not (page.parent / target.split('#')[0]).exists():
                broken.append(f'{page.relative_to(ROOT)}: {target}')
    return broken


def stale(rewrite: bool = False) -> List[str]:
    """The cards that differ from their records' rendering (with ``rewrite``, rewritten instead), cards
    without records, and broken links."""
    problems = []
    for page in sorted(CARDS.glob('*.md')):
        if page.name == 'README.md':
            continue
        if not (CARDS / 'runs' / page.stem / 'card.json').exists():
            problems.append(f'{page.relative_to(ROOT)}: no run records in model_cards/runs/{page.stem}/')
            continue
        rendered = render(page.stem)
        if rendered != page.read_text():
            if rewrite:
                page.write_text(rendered)
            else:
                problems.append(f'{page.relative_to(ROOT)}: differs from its rendering')
    return problems + [f'broken link in {link}' for link in broken_links()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    save_parser = sub.add_parser('save', help="keep a run's records and rendered card in model_cards/")
    save_parser.add_argument('run', type=pathlib.Path)
    save_parser.add_argument('hub_folder', type=pathlib.Path)
    save_parser.add_argument('name', help='arch.tag')
    save_parser.add_argument('--repo-id', required=True)
    save_parser.add_argument('--weights', choices=('best', 'last'), required=True)
    sub.add_parser('check', help='name every stale card and broken link; exit 1 if any')
    args = parser.parse_args(argv)
    if args.command == 'save':
        save(args.run, args.hub_folder, args.name, args.repo_id, args.weights)
        problems = [p for p in stale() if args.name in p]
    else:
        problems = stale()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
