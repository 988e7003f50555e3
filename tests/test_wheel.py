"""``python -m build`` makes a wheel that installs into a fresh environment and runs the models and the
console commands there.

Offline: the wheel is built without build isolation (setuptools from this environment) and
installed with ``--no-deps --no-index`` into a new virtual environment, whose dependencies (torch,
timm, ...) are this environment's site-packages, listed after its own. That folder's ``.pth`` hooks,
the editable install of this checkout among them, are not run there, so ``timm_recursive`` can only
come from the wheel.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow  # a wheel build and a virtual environment, in subprocesses

CHECK = '''
import os, sys, timm, torch
import timm_recursive
from timm_recursive.layers import entmax_kernel
assert timm_recursive.__file__.startswith(sys.argv[1]), timm_recursive.__file__
assert os.path.isfile(entmax_kernel._SOURCE)  # the C++ kernel's source ships in the wheel
assert timm.list_models('recursive_*') and timm.list_models('*_entmax') and timm.list_models('*_tokenfuse')
for name, kwargs, size in (('recursive_dsa_moe_tiny', dict(num_steps=3), 32),
                           ('vit_tiny_entmax', dict(img_size=32, patch_size=8, depth=1), 32),
                           ('deit_t_tokenfuse', dict(img_size=32, patch_size=8, depth=4, reduction_blocks=(1, 2)), 32)):
    out = timm.create_model(name, num_classes=5, **kwargs).eval()(torch.randn(2, 3, size, size))
    assert out.shape == (2, 5) and torch.isfinite(out).all(), name
print('ok', timm_recursive.__version__)
'''


def test_wheel_builds_installs_and_runs_the_models_in_a_fresh_environment(tmp_path):
    source = tmp_path / 'source'  # a copy, so the build leaves no build/ or egg-info in the checkout
    source.mkdir()
    for name in ('pyproject.toml', 'README.md'):
        shutil.copy(os.path.join(ROOT, name), source / name)
    shutil.copytree(os.path.join(ROOT, 'timm_recursive'), source / 'timm_recursive',
                    ignore=shutil.ignore_patterns('__pycache__'))
    dist = tmp_path / 'dist'
    subprocess.run([sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', str(dist), str(source)],
                   check=True, capture_output=True)
    (wheel,) = glob.glob(str(dist / 'timm_recursive-*.whl'))
    names = zipfile.ZipFile(wheel).namelist()
    assert 'timm_recursive/layers/csrc/entmax15_cpu.cpp' in names
    assert {'timm_recursive/hub/templates/recursive_classifier.md',
            'timm_recursive/hub/templates/vision_transformer.md'} <= set(names)

    env = tmp_path / 'env'
    venv.create(env, with_pip=False)
    python = str(env / 'bin' / 'python')
    site = subprocess.check_output([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                                   text=True).strip()
    subprocess.run([sys.executable, '-m', 'pip', '--python', python, 'install', '--quiet', '--no-deps', '--no-index',
                    wheel], check=True, capture_output=True)
    with open(os.path.join(site, 'dependencies.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    environment = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    environment['TIMM_RECURSIVE_ENTMAX_KERNEL'] = 'python'  # building the kernel takes a minute; its source is checked
    result = subprocess.run([python, '-c', CHECK, site], cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == 'ok 0.1.0'

    # the console commands of [project.scripts] are installed and answer --help
    for command in ('timm-recursive-train', 'timm-recursive-evaluate', 'timm-recursive-push-to-hub',
                    'timm-recursive-train-dino', 'timm-recursive-probe'):
        result = subprocess.run([str(env / 'bin' / command), '--help'], cwd=tmp_path, env=environment,
                                capture_output=True, text=True)
        assert result.returncode == 0 and 'usage:' in result.stdout, (command, result.stderr[-3000:])
