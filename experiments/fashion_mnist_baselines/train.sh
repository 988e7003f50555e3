#!/usr/bin/env bash
# The FashionMNIST baselines study (experiments/fashion_mnist_baselines/README.md) under the held-out protocol:
# DSA-MoE and SA-MLP (SA-MoE too with VARIANTS="dsa_moe sa_moe sa_mlp"), CPU-sized (d=128, depth 2, 8 steps),
# today's recipe (the gradient path on: the models' default grad_window=1), seeds 0 1 2, all 60,000 training
# images of which 10% (stratified, seed 0) choose the exported epoch, the 10,000 test images reported.
# Runs go to OUTPUT_ROOT/recursive_<variant>_tiny/seed<S>, two at a time (one thread each); a stopped run
# resumes from its last saved state (mid-epoch included), a finished one is skipped, and each finished run's
# records (summary.json, metrics.jsonl, args.json) are copied into results/held_out/ for the study's tables.
# Usage: experiments/fashion_mnist_baselines/train.sh [OUTPUT_ROOT] [extra timm-recursive train arguments]
# Environment: EPOCHS (10), SEEDS ("0 1 2"), VARIANTS ("dsa_moe sa_mlp"), JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/fashion_mnist}
shift || true
results=experiments/fashion_mnist_baselines/results/held_out

run() {  # VARIANT SEED [extra arguments]
    local variant=$1 seed=$2 name="recursive_$1_tiny/seed$2"
    shift 2
    if [ ! -f "$out/$name/summary.json" ]; then
        mkdir -p "$out/recursive_${variant}_tiny"
        echo "training $name"
        OMP_NUM_THREADS=1 .venv/bin/timm-recursive train \
            --model "recursive_${variant}_tiny.fashion_mnist" --model-kwargs num_steps=8 \
            --dataset fashion_mnist --epochs "${EPOCHS:-10}" --batch-size 128 --lr 1e-3 --weight-decay 0.05 \
            --warmup-epochs 1 --clip-grad 1.0 --label-smoothing 0.1 --scale 0.75 1 --hflip 0.5 --seeds "$seed" \
            --output "$out/$name" --resume --no-progress "$@" > "$out/$name.log" 2>&1 \
            || { echo "FAILED: $name (see $out/$name.log)"; return 1; }
    fi
    mkdir -p "$results/$name"
    cp "$out/$name"/{summary.json,metrics.jsonl,args.json} "$results/$name/"
    echo "done: $name -> $results/$name"
}
export -f run
export out results EPOCHS
export EXTRA="$*"  # the extra train arguments, word-split in each run

for seed in ${SEEDS:-0 1 2}; do
    for variant in ${VARIANTS:-dsa_moe sa_mlp}; do
        echo "$variant $seed"
    done
done | xargs -P "${JOBS:-2}" -L 1 bash -c 'run "$0" "$1" $EXTRA'
