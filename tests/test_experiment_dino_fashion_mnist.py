"""experiments/dino_fashion_mnist: collect.py gathers the runs and tables.py makes the study's tables from them."""
import json
import pathlib
import subprocess
import sys

from timm_recursive.analysis.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'dino_fashion_mnist'


def _variant_run(folder: pathlib.Path, model: str, top1: float, **model_kwargs) -> None:
    folder.mkdir(parents=True)
    summary = {'model': model, 'model_kwargs': {'embed_dim': 192, **model_kwargs}, 'train_images': 1000,
               'epochs': 2, 'hardware': 'CPU, 1 thread', 'wall_time_s': 240.0, 'final': {'loss': 6.5}}
    segment = {'miou': 12.0, 'pixel_accuracy': 57.0, 'per_class_iou': [82.0, 5.0, 14.5], 'train_images': 300,
               'eval_images': 150, 'img_size': 56, 'num_classes': 3}
    files = {'summary': summary, 'linear': {'top1': top1, 'train_images': 2000, 'eval_images': 10000},
             'segment': segment, 'segment_cls': {**segment, 'miou': 15.0}}
    for name, data in files.items():
        (folder / f'{name}.json').write_text(json.dumps(data))


def test_collect_then_tables(tmp_path):
    _variant_run(tmp_path / 'entmax', 'vit_small_entmax', 59.0)
    _variant_run(tmp_path / 'reg4', 'vit_small_patch16_224', 44.0, reg_tokens=4)
    (tmp_path / 'canvases').mkdir()  # not a run: skipped
    sparsity = {'zero_fraction': [0.25], 'support_per_head': [[6.0, 9.0]], 'seq_len': 10, 'alpha': [1.5]}
    (tmp_path / 'sparsity.json').write_text(json.dumps({'entmax': sparsity}))  # attention_maps --compare's
    result = subprocess.run([sys.executable, str(STUDY / 'collect.py'), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / 'results.json').read_text())
    assert sorted(results) == ['entmax', 'reg4']
    assert results['entmax']['attention_sparsity'] == sparsity and 'attention_sparsity' not in results['reg4']

    pieces = import_file(STUDY / 'tables.py').tables(tmp_path)
    assert '| reg4 | `vit_small_patch16_224` reg_tokens=4 | 1,000 x 2 | 4.0 | 6.5000 | 44.00 | 12.00 | 15.00 |' \
        in pieces['main']
    assert '| entmax | 57.00 / 82.00 / 14.50 | 57.00 / 82.00 / 14.50 |' in pieces['dense']
    assert pieces['linear_gap'] == '15.0'
    assert pieces['headline'].startswith('linear probe top-1 entmax 59.00%, reg4 44.00% (one seed; ViTs of width 192')


def test_collect_refuses_an_empty_root(tmp_path):
    result = subprocess.run([sys.executable, str(STUDY / 'collect.py'), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and 'no finished variant' in result.stderr
