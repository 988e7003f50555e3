"""What every study's ``run.py`` shares: a cell (a design and its recipe), the order its seeds train in, one run
trained by ``timm-recursive train`` into ``OUT/<cell>/seed<S>`` (resumed when stopped, skipped when finished), its
records copied into the study's ``results/`` and, on request, committed at once, so that a session that ends
mid-study keeps every finished run.

A study defines its cells and how a cell becomes a command (``train_arguments``); ``run_study`` does the rest.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from timm_recursive.cli.args import positive_int

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = ROOT / '.venv' / 'bin' / 'timm-recursive'
RECORDS = ('summary.json', 'metrics.jsonl', 'args.json')
# experiments/fashion_mnist_baselines' recipe (its train.sh), which the FashionMNIST studies start from
FASHION_MNIST_RECIPE = ('--dataset', 'fashion_mnist', '--batch-size', '128', '--lr', '1e-3', '--weight-decay', '0.05',
                        '--warmup-epochs', '1', '--clip-grad', '1.0', '--label-smoothing', '0.1', '--scale', '0.75',
                        '1', '--hflip', '0.5')


class Cell(NamedTuple):
    name: str
    model: str  # a timm model name (with its dataset's config tag)
    kwargs: Tuple[str, ...]  # --model-kwargs
    recipe: str
    seeds: Tuple[int, ...] = (0, 1, 2)
    train_args: Tuple[str, ...] = ()


def schedule(cells: Sequence[Cell]) -> List[Tuple[Cell, int]]:
    """(cell, seed) in the order they are trained: every cell's first seed, then the second, and so on."""
    most = max(len(cell.seeds) for cell in cells)
    return [(cell, cell.seeds[i]) for i in range(most) for cell in cells if i < len(cell.seeds)]


def _shown(path: pathlib.Path) -> pathlib.Path:
    """``path`` relative to the checkout when inside it (what a record or a message names), else as it is."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def train_command(cell: Cell, seed: int, output: pathlib.Path, recipe: Sequence[str]) -> List[str]:
    """``timm-recursive train`` for one seed of ``cell``: its model, ``recipe``, then the cell's own arguments; an
    ``output`` inside the checkout is given relative to it (the command runs there), so records name no path
    outside the repository."""
    kwargs = ['--model-kwargs', *cell.kwargs] if cell.kwargs else []
    return [str(TRAIN), 'train', '--model', cell.model, *kwargs, *recipe, *cell.train_args,
            '--seeds', str(seed), '--output', str(_shown(pathlib.Path(output).resolve())), '--resume', '--no-progress']


def offline_env(threads: int = 1) -> Dict[str, str]:
    """``threads`` intra-op threads per run, the Hub read from local caches only (unless the caller's environment
    says otherwise)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE=os.environ.get('HF_HUB_OFFLINE', '1'),
                HF_DATASETS_OFFLINE=os.environ.get('HF_DATASETS_OFFLINE', '1'))


def _git(*args: str) -> subprocess.CompletedProcess:
    """A git command in the repository, retried while another git process holds the index."""
    for _ in range(10):
        done = subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True)
        if 'index.lock' not in done.stderr:
            return done
        time.sleep(3)
    raise RuntimeError(f'git {args[0]}: the index stayed locked')


def commit(paths: List[pathlib.Path], message: str) -> None:
    """Commit only ``paths`` (other staged or changed files are left alone)."""
    added = _git('add', '--', *map(str, paths))
    if added.returncode != 0:
        raise RuntimeError(f'git add failed: {added.stderr.strip()}')
    done = _git('commit', '-q', '-m', message, '--only', '--', *map(str, paths))
    if done.returncode != 0 and 'nothing' not in done.stdout + done.stderr:
        raise RuntimeError(f'git commit failed: {done.stderr.strip()}')


class Study(NamedTuple):
    """A study's cells and how to run them: ``command(cell, seed, output)`` is the training command,
    ``results`` the folder its records are kept in, ``name`` the prefix of its commit messages."""
    name: str
    cells: Dict[str, Cell]
    command: Callable[[Cell, int, pathlib.Path], List[str]]
    results: pathlib.Path


def run_one(study: Study, cell: Cell, seed: int, out: pathlib.Path, commit_results: bool, threads: int = 1) -> str:
    """Train one seed of ``cell`` unless it has finished, keep its records, and commit them if asked."""
    folder = out / cell.name / f'seed{seed}'
    name = f'{cell.name}/seed{seed}'
    if not (folder / 'summary.json').exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        print(f'training {name}', flush=True)
        with open(folder.parent / f'seed{seed}.log', 'a') as log:
            done = subprocess.run(study.command(cell, seed, folder), stdout=log, stderr=subprocess.STDOUT,
                                  env=offline_env(threads), cwd=ROOT)
        if done.returncode != 0:
            return f'FAILED: {name} (exit {done.returncode}, see {folder.parent / f"seed{seed}.log"})'
    saved = study.results / cell.name / f'seed{seed}'
    saved.mkdir(parents=True, exist_ok=True)
    for record in RECORDS:
        shutil.copyfile(folder / record, saved / record)
    if commit_results:
        script = study.results.parent.relative_to(ROOT) / 'run.py'
        commit([saved], f'{study.name}: {name} landed ({cell.recipe} recipe, run by {script})')
    return f'done: {name} -> {_shown(saved)}'


def add_arguments(parser: argparse.ArgumentParser, study: Study, default_out: pathlib.Path) -> None:
    """The options every study's run.py takes: where runs go, how many at once, which cells and seeds, commits."""
    parser.add_argument('--out', type=pathlib.Path, default=default_out)
    parser.add_argument('--jobs', type=positive_int, default=2, help='trainings at once')
    # two runs of one thread train more images an hour on two cores; one run of two threads finishes sooner
    # (a run's summary.json records its threads)
    parser.add_argument('--threads', type=positive_int, default=1, help='intra-op threads per training')
    parser.add_argument('--only', nargs='+', choices=sorted(study.cells), metavar='CELL', help='these cells only')
    parser.add_argument('--seeds', type=int, nargs='+', help='these seeds only (of each cell\'s)')
    parser.add_argument('--commit', action='store_true', help='commit each finished run\'s records as it lands')


def selected_cells(study: Study, only: Optional[Sequence[str]], seeds: Optional[Sequence[int]]) -> List[Cell]:
    cells = [study.cells[name] for name in only] if only else list(study.cells.values())
    if seeds:
        cells = [cell._replace(seeds=tuple(s for s in cell.seeds if s in seeds)) for cell in cells]
        cells = [cell for cell in cells if cell.seeds]
    return cells


def run_study(study: Study, args: argparse.Namespace) -> int:
    """Train the cells ``add_arguments``'s options select, ``--jobs`` at once; exit status 1 if any run failed."""
    failed = False
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = schedule(selected_cells(study, args.only, args.seeds))
        for message in pool.map(lambda job: run_one(study, *job, args.out, args.commit, args.threads), jobs):
            print(message, flush=True)
            failed |= message.startswith('FAILED')
    return 1 if failed else 0
