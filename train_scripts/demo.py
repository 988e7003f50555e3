"""`make demo`: train a small recursive DSA-MoE on scikit-learn's digits, then inspect and reload it.

1. trains ``recursive_dsa_moe_tiny`` (8 recursion steps) with ``train_scripts/train.py`` on the
   bundled digits (1,347 train / 450 test images, offline), a couple of minutes on 2 CPU cores;
2. prints the test accuracy at every recursion step and what one forward does step by step
   (sequence length, keys per query, tokens per expert);
3. prints the efficiency tables of the demo size and of the reported CIFAR configuration (SA-MLP
   baseline vs DSA-MoE);
4. exports the best epoch as a Hub-ready folder (``model.safetensors``, ``config.json`` and a model
   card rendered from the run's metrics), reloads it with ``timm.create_model('local-dir:...')``,
   re-evaluates it and checks it reproduces the accuracy the run recorded.

Exits non-zero if the test accuracy is below 95% or the reloaded model disagrees.
"""
import argparse
import json
import os
import subprocess
import sys

import timm
import torch
from torch.utils.data import DataLoader

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.efficiency import build_reports, format_table
from timm_recursive.data import (
    collate_classification,
    create_dataset_transform,
    resolve_dataset,
)
from timm_recursive.hub import HUB_ORG, export_run
from timm_recursive.runs import run_dir_for
from timm_recursive.train import StepOutputs, evaluate_steps

TARGET = 95.0
HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_ARGS = ['--model', 'recursive_dsa_moe_tiny', '--in-chans', '1', '--model-kwargs', 'num_steps=8',
              '--dataset', 'digits', '--val-fraction', '0.1', '--epochs', '15', '--batch-size', '64',
              '--scale', '0.8', '1', '--hflip', '0']


def show_steps(model, images) -> None:
    """One forward, step by step: sequence length, keys per query (block 0), tokens per expert, predictions."""
    attn, moe = model.blocks[0].attn, model.blocks[0].moe
    keys, routed = [], []
    hooks = [
        attn.register_forward_hook(lambda m, inp, out: keys.append((inp[0].shape[1], m.select(inp[0]).shape[-1]))),
        moe.register_forward_hook(lambda m, inp, out: routed.append(torch.bincount(
            m.route(inp[0].reshape(-1, inp[0].shape[-1]))[3].flatten(), minlength=m.num_experts).tolist())),
    ]
    with torch.no_grad():
        step_logits, _ = model.forward_steps(images)
    for h in hooks:
        h.remove()
    print(f'{"step":>4} {"L_t":>4} {"keys/query":>10} {"tokens per expert (block 0)":>28}  predictions')
    for t, ((length, k), counts, logits) in enumerate(zip(keys, routed, step_logits), start=1):
        print(f'{t:>4} {length:>4} {k:>10} {str(counts):>28}  {logits.argmax(-1).tolist()}')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0], allow_abbrev=False)
    parser.add_argument('--output', default='runs/demo')
    args = parser.parse_args()
    # a previous demo's folder is kept: train.py would write to the next free one, which the demo must read
    args.output = run_dir_for(args.output, resume=None)

    print(f'== 1. Training: OMP_NUM_THREADS=1 python train_scripts/train.py {" ".join(TRAIN_ARGS)} '
          f'--output {args.output}', flush=True)
    # one thread, as the run in experiments/digits_demo was trained: another thread count sums in another
    # order and ends at other (equally valid) numbers
    subprocess.run([sys.executable, os.path.join(HERE, 'train.py'), *TRAIN_ARGS, '--output', args.output,
                    '--no-progress'], check=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    with open(os.path.join(args.output, 'summary.json')) as f:
        summary = json.load(f)
    best = summary['best']

    export = export_run(args.output, os.path.join(args.output, 'hub'),
                        repo_id=f'{HUB_ORG}/recursive_dsa_moe_tiny.digits')
    print(f'\n== 2. Hub-ready folder {export} ({", ".join(sorted(os.listdir(export)))}); '
          f'reloading it with timm.create_model("local-dir:...") ==')
    model = timm.create_model(f'local-dir:{os.path.abspath(export)}', pretrained=True).eval()
    splits = resolve_dataset('digits')
    test = splits.eval.with_transform(create_dataset_transform(model, splits, is_training=False))
    result = evaluate_steps(StepOutputs(model), DataLoader(test, batch_size=256, collate_fn=collate_classification))
    print(f'{"step":>5} {"top-1 % (test)":>15}')
    for t, acc in enumerate(result['top1'], start=1):
        print(f'{t:>5} {acc:>15.2f}')
    print(f'trained run, epoch {best["epoch"]}: {best["eval_top1"]:.2f}%; reloaded: {result["top1"][-1]:.2f}% '
          f'({result["images_per_s"]:.0f} images/s)')

    print('\n== 3. One forward of the trained model on 8 test digits, step by step ==')
    batch = collate_classification([test[i] for i in range(8)])
    print(f'labels: {batch["label"].tolist()}')
    show_steps(model, batch['pixel_values'])

    print('\n== 4. Efficiency (timm-recursive efficiency ...) ==')
    for specs in (['recursive_sa_mlp_tiny:num_steps=8', 'recursive_dsa_moe_tiny:num_steps=8'],
                  ['recursive_sa_mlp_cifar', 'recursive_dsa_moe_cifar']):
        print(format_table(build_reports(specs)) + '\n')

    ok = True
    if result['top1'] != best['eval_top1_per_step']:
        print(f'FAIL: the reloaded model gives {result["top1"]}, the run recorded {best["eval_top1_per_step"]}')
        ok = False
    if result['top1'][-1] < TARGET:
        print(f'FAIL: test accuracy {result["top1"][-1]:.2f}% is below the {TARGET}% target')
        ok = False
    if ok:
        print(f'\nOK: {result["top1"][-1]:.2f}% test accuracy (target {TARGET}%), the reloaded model reproduces the '
              f'run. Hub-ready folder: {export}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
