"""experiments/fashion_mnist_zoo: its runs' commands and the search table made from their records."""
import json
import pathlib

from tools.generated_markdown import import_file
from tools.study_runs import ROOT

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'fashion_mnist_zoo'
zoo_run = import_file(STUDY / 'run.py')
zoo_tables = import_file(STUDY / 'tables.py')


def test_every_cell_holds_out_images_changes_a_lever_and_names_its_output_from_the_checkout():
    for name, cell in zoo_run.CELLS.items():
        command = zoo_run.train_command(cell, 0, ROOT / 'runs' / 'fashion_mnist_zoo' / name / 'seed0')
        assert '--val-fraction' not in command  # the default: 10% held out, never the test split
        assert command[command.index('--output') + 1] == f'runs/fashion_mnist_zoo/{name}/seed0'
        if name.startswith('search_'):
            assert zoo_tables.lever(cell), name  # something differs from the reference
            assert command[command.index('--epochs') + 1] == '10'


def _record(folder: pathlib.Path, held_out, seed=0):
    folder.mkdir(parents=True)
    lines = [json.dumps({'epoch': i + 1, 'selection_top1': v}) for i, v in enumerate(held_out)]
    (folder / 'metrics.jsonl').write_text('\n'.join(lines) + '\n')
    (folder / 'summary.json').write_text(json.dumps({
        'seed': seed, 'wall_time_s': 600., 'commit': 'a' * 40, 'dirty': False, 'date': '2026-12-06T00:00:00Z',
        'hardware': 'CPU, 1 thread',
        'command': 'timm-recursive train --output /somewhere/checkout/runs/fashion_mnist_zoo/x/seed0 --resume'}))


def test_the_search_table_reads_the_last_held_out_epoch_against_the_references_seeds(tmp_path):
    reference = tmp_path / 'reference'
    for seed, last in enumerate((91.0, 91.5, 92.0)):
        _record(reference / f'seed{seed}', [80.0, last], seed)
    _record(tmp_path / 'results' / 'search_enc64' / 'seed0', [85.0, 93.0])  # its best epoch is the last
    _record(tmp_path / 'results' / 'search_reprob' / 'seed0', [92.5, 90.5])  # read at the last epoch, not the best
    table = zoo_tables.search_table(tmp_path / 'results', zoo_run.CELLS, reference)
    assert '| reference | ' in table and '| 3 | 91.50 (seeds 91.00 to 92.00) |' in table
    assert '| `search_enc64` | `encoder_chans=(64,128,256)` | 1 | 93.00 | +1.50 | 10 |' in table
    assert '| `search_reprob` | `--reprob 0.25` | 1 | 90.50 | -1.00 | 10 |' in table
    assert 'search_steps16' not in table  # not run yet
    provenance = zoo_tables.provenance_table(tmp_path / 'results')
    assert '--output runs/fashion_mnist_zoo/x/seed0 --resume' in provenance and '/somewhere' not in provenance
