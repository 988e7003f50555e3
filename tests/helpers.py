"""Shared by the tests: the command-line commands as modules, a training run of a few seconds, and the check
that bad input is one error line."""
import importlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a few seconds per run: 64 digits, 3 recursion steps, batch 16
TINY_RUN = ['--model', 'recursive_dsa_moe_tiny', '--dataset', 'digits', '--model-kwargs', 'num_steps=3', 'topk=2',
            '--max-train-samples', '64', '--max-eval-samples', '40', '--batch-size', '16', '--eval-batch-size', '16',
            '--scale', '0.8', '1', '--hflip', '0', '--no-progress', '--warmup-epochs', '1']


def load_script(name: str):
    """The module of the command ``train_scripts/<name>.py`` runs (``timm_recursive.train.commands.<name>``)."""
    return importlib.import_module(f'timm_recursive.train.commands.{name}')


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
    assert 'Traceback' not in err and not output.exists()
