#!/usr/bin/env bash
# The source's ablations of the recursive classifier on FashionMNIST, sized for 2 CPU cores: a fixed
# training subset (the first 6,000 training images), 4 epochs, the first 5,000 test images; tiny
# models (d=128, depth 2) at the source's operating point (16 steps, k=6, hard hypothesis) unless the
# ablation changes it:
#   variants  SA-MLP / SA-MoE / DSA-MoE, seeds 0 1 2 (mean and standard deviation)
#   k         DSA-MoE with k=2 (seed 0) against k=6
#   depth     DSA-MoE with 4 and 8 recursion steps (seed 0) against 16
# Every run resumes from its last saved epoch; finished runs are skipped. Tables for the README:
#   python scripts/ablation_tables.py OUTPUT_ROOT
# Usage: scripts/ablations.sh [OUTPUT_ROOT] [PARALLEL_RUNS] [extra train.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/ablations}
jobs=${2:-2}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")

run() {  # NAME MODEL SEED [model kwargs...]
    local name=$1 model=$2 seed=$3
    shift 3
    [ -f "$out/$name/summary.json" ] && { echo "done: $name"; return 0; }
    echo "training $name"
    mkdir -p "$(dirname "$out/$name")"
    # one thread per run: the runs themselves share the cores
    OMP_NUM_THREADS=1 .venv/bin/python train_scripts/train.py \
        --model "recursive_${model}_tiny.fashion_mnist" --model-kwargs num_steps=16 "$@" \
        --dataset fashion_mnist --max-train-samples 6000 --max-eval-samples 5000 --epochs 4 \
        --batch-size 128 --lr 1e-3 --weight-decay 0.05 --warmup-epochs 1 --clip-grad 1.0 \
        --label-smoothing 0.1 --scale 0.75 1 --hflip 0.5 --seeds "$seed" \
        --output "$out/$name" --resume --no-progress "${extra[@]}" > "$out/$name.log" 2>&1 \
        || { echo "FAILED: $name (see $out/$name.log)"; return 1; }
}
export -f run
export out
export extra_args="${extra[*]:-}"

mkdir -p "$out"
# most informative first: the three variants' seed 0, the k and depth ablations, then more seeds
{
    for seed in 0; do for v in dsa_moe sa_mlp sa_moe; do echo "${v}/seed${seed} $v $seed"; done; done
    echo "dsa_moe_k2 dsa_moe 0 topk=2"
    echo "dsa_moe_steps4 dsa_moe 0 num_steps=4"
    echo "dsa_moe_steps8 dsa_moe 0 num_steps=8"
    for seed in 1 2; do for v in dsa_moe sa_mlp sa_moe; do echo "${v}/seed${seed} $v $seed"; done; done
} | xargs -P "$jobs" -L 1 bash -c 'extra=($extra_args); run "$@"' _
