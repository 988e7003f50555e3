#!/usr/bin/env bash
# The FashionMNIST baselines study (experiments/fashion_mnist_baselines/README.md): the three recursive
# variants, CPU-sized (d=128, depth 2, 8 steps), one recipe (24 epochs: about an hour per variant on 2
# CPU cores), trained one after the other on the Debian package's IDX files (or the Hub dataset) into
# OUTPUT_ROOT/recursive_<variant>_tiny. A stopped run resumes from its last saved epoch, so a run is
# never lost or overwritten; the study's results/ changes only when a run's files are copied there.
# Usage: experiments/fashion_mnist_baselines/train.sh [OUTPUT_ROOT] [extra train.py arguments, e.g. --epochs 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/fashion_mnist}
shift || true
for variant in dsa_moe sa_moe sa_mlp; do
    .venv/bin/python train_scripts/train.py \
        --model "recursive_${variant}_tiny.fashion_mnist" --model-kwargs num_steps=8 \
        --dataset fashion_mnist --epochs 24 --batch-size 128 --lr 1e-3 --weight-decay 0.05 \
        --warmup-epochs 1 --clip-grad 1.0 --label-smoothing 0.1 --scale 0.75 1 --hflip 0.5 \
        --output "$out/recursive_${variant}_tiny" --resume --no-progress "$@"
done
