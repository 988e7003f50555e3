"""Shared by the tests: the command-line commands as modules, a training run of a few seconds, the check
that bad input is one error line, a Hub checkpoint laid into an offline cache, and the environment that runs
the CUDA path's Triton kernels on CPU."""
import importlib
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the environment of a fresh Python whose entmax attention runs adasplash's Triton kernels on CPU, under Triton's
# interpreter (tests/test_gpu_kernels.py says why not in the test's own process)
INTERPRETED_KERNELS = {**os.environ, 'TRITON_INTERPRET': '1', 'TIMM_RECURSIVE_ENTMAX_KERNEL': 'adasplash'}

# a few seconds per run: 64 digits, 3 recursion steps, batch 16
TINY_RUN = ['--model', 'recursive_dsa_moe_tiny', '--dataset', 'digits', '--model-kwargs', 'num_steps=3', 'topk=2',
            '--max-train-samples', '64', '--max-eval-samples', '40', '--batch-size', '16', '--eval-batch-size', '16',
            '--scale', '0.8', '1', '--hflip', '0', '--no-progress', '--warmup-epochs', '1']


def load_script(name: str):
    """The module of the command ``train_scripts/<name>.py`` runs (``timm_recursive.cli.<name>``)."""
    return importlib.import_module(f'timm_recursive.cli.{name}')


def assert_one_error_line(main, argv, output, capsys, message: str) -> None:
    """``main(argv)`` exits 2 (returned or argparse's SystemExit) with one ``error:`` line holding ``message``,
    no traceback, and ``output`` never created."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's usage errors
        status = e.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if 'error:' in line]
    assert status == 2 and len(errors) == 1 and message in errors[0], err
    assert 'Traceback' not in err and 'usage:' not in err and not output.exists(), err


def cache_hub_checkpoint(cache_dir, monkeypatch, repo_id: str, state_dict) -> None:
    """Lay ``state_dict`` out as ``hf_hub_download`` leaves ``repo_id``'s ``model.safetensors`` in ``cache_dir``
    (a pathlib folder) and point the offline Hub cache there, so pretrained loading runs without the network."""
    import safetensors.torch
    from huggingface_hub import constants
    repo = cache_dir / ('models--' + repo_id.replace('/', '--'))
    snapshot = repo / 'snapshots' / ('0' * 40)
    snapshot.mkdir(parents=True)
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text('0' * 40)
    safetensors.torch.save_file(state_dict, str(snapshot / 'model.safetensors'))
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(cache_dir))


TIMING_FIELDS = ('train_images_per_s', 'eval_images_per_s', 'wall_time_s')


def measured_metrics(run_dir: str):
    """A run's ``metrics.jsonl`` without its timing fields: what a rerun of the same command must repeat."""
    with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS} for line in f]
