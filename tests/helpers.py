"""Shared by the tests: the command-line scripts as modules, and a training run of a few seconds."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a few seconds per run: 64 digits, 3 recursion steps, batch 16
TINY_RUN = ['--model', 'recursive_dsa_moe_tiny', '--dataset', 'digits', '--model-kwargs', 'num_steps=3', 'topk=2',
            '--max-train-samples', '64', '--max-eval-samples', '40', '--batch-size', '16', '--eval-batch-size', '16',
            '--scale', '0.8', '1', '--hflip', '0', '--no-progress', '--warmup-epochs', '1']


def load_script(name: str):
    """``train_scripts/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'train_scripts', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
