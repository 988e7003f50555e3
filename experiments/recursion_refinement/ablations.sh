#!/usr/bin/env bash
# The source's ablations of the recursive classifier on FashionMNIST, sized for 2 CPU cores: a fixed
# training subset (the first 6,000 training images), 4 epochs, the first 5,000 test images; tiny
# models (d=128, depth 2) at the source's operating point (16 steps, k=6, hard hypothesis) unless the
# ablation changes it:
#   variants  SA-MLP / SA-MoE / DSA-MoE, seeds 0 1 2 (mean and standard deviation)
#   k         DSA-MoE with k=2 against k=6 (seeds 0 1 2; seed 1 and 2 runs are named NAME_seedS)
#   depth     DSA-MoE with 4, 8 and 12 recursion steps against 16 (the source's 8-12; seeds 0 1 2)
#   gradient  DSA-MoE with the history detached (grad_window=0) and with linear step weights
#             (each with the default grad_window=1 and with 0), against the default (seed 0)
#   levers    DSA-MoE with one step (no recursion), with depth 1 (half the per-step capacity) and
#             with a soft hypothesis (seed 0): what would let later steps add to the first
#   objective DSA-MoE trained on the final step only (--step-weighting last, gradient through the
#             whole recursion, as timm's training of `forward` does) at 4 / 8 / 16 steps and with k=2
#             (seed 0): the source does not say it uses deep supervision, and its depth and k findings
#             compare final accuracies
# Every run resumes from its last saved epoch; finished runs are skipped, so a run is never lost or
# overwritten. The study's tables (tables.py) read results/<root>/<run>/: copy a finished run's
# summary.json, metrics.jsonl and args.json there, then `python experiments/render.py`.
# Usage: experiments/recursion_refinement/ablations.sh [OUTPUT_ROOT] [PARALLEL_RUNS] [extra train.py arguments]
# Other scales through the environment: ABLATION_DATASET (fashion_mnist | mnist | cifar10 | cifar100,
# the Hub datasets or, for the MNISTs, IDX files), ABLATION_SIZE (tiny | cifar: d=512, depth 4),
# ABLATION_EPOCHS (4), ABLATION_TRAIN_SAMPLES (6000; 0 = all), ABLATION_EVAL_SAMPLES (5000; 0 = all),
# ABLATION_THREADS (1 per run), ABLATION_ONLY (space-separated run names, e.g. "dsa_moe/seed0
# dsa_moe_k2": only these). With a GPU and the network, the source's scale on CIFAR-10:
#   ABLATION_DATASET=cifar10 ABLATION_SIZE=cifar ABLATION_EPOCHS=100 ABLATION_TRAIN_SAMPLES=0 \
#   ABLATION_EVAL_SAMPLES=0 experiments/recursion_refinement/ablations.sh runs/ablations_cifar10 1 --mixed-precision bf16 --workers 8
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/ablations}
jobs=${2:-2}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
dataset=${ABLATION_DATASET:-fashion_mnist}
size=${ABLATION_SIZE:-tiny}
subset=()
[ "${ABLATION_TRAIN_SAMPLES:-6000}" != 0 ] && subset+=(--max-train-samples "${ABLATION_TRAIN_SAMPLES:-6000}")
[ "${ABLATION_EVAL_SAMPLES:-5000}" != 0 ] && subset+=(--max-eval-samples "${ABLATION_EVAL_SAMPLES:-5000}")

run() {  # NAME MODEL SEED [model kwargs...] [-- train.py arguments...]
    local name=$1 model=$2 seed=$3 kwargs=() args=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do kwargs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    args=("$@")
    [ -f "$out/$name/summary.json" ] && { echo "done: $name"; return 0; }
    echo "training $name"
    mkdir -p "$(dirname "$out/$name")"
    # one thread per run by default: the runs themselves share the cores
    OMP_NUM_THREADS=${ABLATION_THREADS:-1} .venv/bin/timm-recursive train \
        --model "recursive_${model}_${size}.${dataset}" --model-kwargs num_steps=16 "${kwargs[@]}" \
        --dataset "$dataset" "${subset[@]}" --epochs "${ABLATION_EPOCHS:-4}" \
        --batch-size 128 --lr 1e-3 --weight-decay 0.05 --warmup-epochs 1 --clip-grad 1.0 \
        --label-smoothing 0.1 --scale 0.75 1 --hflip 0.5 --seeds "$seed" \
        --output "$out/$name" --resume --no-progress "${args[@]}" "${extra[@]}" > "$out/$name.log" 2>&1 \
        || { echo "FAILED: $name (see $out/$name.log)"; return 1; }
}
export -f run
export out dataset size
export subset_args="${subset[*]}"
export extra_args="${extra[*]:-}"

# most informative first: the three variants' seed 0, the k and depth ablations, then more seeds
runs=$({
    for seed in 0; do for v in dsa_moe sa_mlp sa_moe; do echo "${v}/seed${seed} $v $seed"; done; done
    echo "dsa_moe_k2 dsa_moe 0 topk=2"
    echo "dsa_moe_steps4 dsa_moe 0 num_steps=4"
    echo "dsa_moe_steps8 dsa_moe 0 num_steps=8"
    echo "dsa_moe_steps12 dsa_moe 0 num_steps=12"
    for seed in 1 2; do
        echo "dsa_moe_k2_seed$seed dsa_moe $seed topk=2"
        for steps in 4 8 12; do echo "dsa_moe_steps${steps}_seed$seed dsa_moe $seed num_steps=$steps"; done
    done
    echo "dsa_moe_window0 dsa_moe 0 grad_window=0"
    echo "dsa_moe_linear dsa_moe 0 -- --step-weighting linear"
    echo "dsa_moe_window0_linear dsa_moe 0 grad_window=0 -- --step-weighting linear"
    for seed in 1 2; do for v in dsa_moe sa_mlp sa_moe; do echo "${v}/seed${seed} $v $seed"; done; done
    echo "dsa_moe_steps1 dsa_moe 0 num_steps=1"
    echo "dsa_moe_depth1 dsa_moe 0 depth=1"
    echo "dsa_moe_soft dsa_moe 0 y_embed=soft"
    echo "dsa_moe_last dsa_moe 0 grad_window=15 -- --step-weighting last"
    echo "dsa_moe_last_steps4 dsa_moe 0 num_steps=4 grad_window=3 -- --step-weighting last"
    echo "dsa_moe_last_steps8 dsa_moe 0 num_steps=8 grad_window=7 -- --step-weighting last"
    echo "dsa_moe_last_k2 dsa_moe 0 topk=2 grad_window=15 -- --step-weighting last"
})
if [ -n "${ABLATION_ONLY:-}" ]; then
    for name in $ABLATION_ONLY; do
        grep -q "^$name " <<< "$runs" || { echo "error: ABLATION_ONLY names no run of this script: $name" >&2; exit 2; }
    done
    runs=$(grep -E "^($(tr ' ' '|' <<< "$ABLATION_ONLY")) " <<< "$runs")
fi
mkdir -p "$out"
xargs -P "$jobs" -L 1 bash -c 'extra=($extra_args); subset=($subset_args); run "$@"' _ <<< "$runs"
