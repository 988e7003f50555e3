#!/usr/bin/env bash
# Adaptive halting of the reference tiny DSA-MoE on FashionMNIST: does stopping each
# image at its own step keep the 16-step accuracy for less compute?
#   1. trains the reference model (seed 0) exactly as the ablations do (first 6,000 training images,
#      4 epochs; resumes, skipped once finished) into OUTPUT_ROOT/ablation/dsa_moe/seed0, and the same
#      model with a learned halting head trained by PonderNet's objective (--halting ponder_net in
#      place of deep supervision) into OUTPUT_ROOT/ponder_net/dsa_moe/seed0, and PonderNet models with
#      other ponder weights (the KL term's weight beta; 0.01 above) into
#      OUTPUT_ROOT/ponder_net_beta<BETA>/dsa_moe/seed0 (HALTING_PONDER_BETAS, default "0.001 0.1 1");
#   2. measures the confidence and change exits on the reference model and the learned head's exit on
#      each PonderNet model, with each run's last epoch's weights on the first 5,000 test images, into
#      OUTPUT_ROOT/<criterion>.json (halting_beta<BETA>.json for the other ponder weights)
#      (timm-recursive adaptive-halting; a measurement already there is kept);
#   3. with --save, copies the measurements and the runs' records into HALTING_RESULTS
#      (experiments/adaptive_halting/results/) and draws the figure there (the only step that changes
#      results/).
# Usage: experiments/adaptive_halting/run.sh OUTPUT_ROOT [--save]
# Environment: HALTING_THREADS (threads per process, 1), HALTING_JOBS (trainings at once, 2),
# HALTING_PONDER_BETAS (empty: none), HALTING_EVAL_SAMPLES (first test images measured, 5000),
# HALTING_RESULTS, and ablations.sh's ABLATION_* recipe variables. The full-data 4-epoch recipe
# (all 60,000 training images, every test image), into results/full_data/:
#   ABLATION_TRAIN_SAMPLES=0 ABLATION_EVAL_SAMPLES=0 HALTING_EVAL_SAMPLES=10000 HALTING_PONDER_BETAS= \
#   HALTING_RESULTS=experiments/adaptive_halting/results/full_data \
#   experiments/adaptive_halting/run.sh runs/adaptive_halting_full_data --save
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/adaptive_halting
out=${1:?usage: $study/run.sh OUTPUT_ROOT [--save]}
save=${2:-}
threads=${HALTING_THREADS:-1}
max_jobs=${HALTING_JOBS:-2}
ponder_betas=${HALTING_PONDER_BETAS-0.001 0.1 1}
eval_samples=${HALTING_EVAL_SAMPLES:-5000}
results=${HALTING_RESULTS:-$study/results}
# the recursion study's recipe (one script trains every run of that recipe)
ablations=experiments/recursion_refinement/ablations.sh

failed=0
train() {  # OUTPUT_ROOT [train.py arguments...]: in the background, at most max_jobs at once
    while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || failed=1; done
    ABLATION_ONLY=dsa_moe/seed0 ABLATION_THREADS=$threads "$ablations" "$1" 1 "${@:2}" &
}
train "$out/ablation"
train "$out/ponder_net" --halting ponder_net
for beta in $ponder_betas; do
    train "$out/ponder_net_beta$beta" --halting ponder_net --halting-beta "$beta"
done
for pid in $(jobs -p); do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "error: a training run failed (its log is beside its folder under $out)" >&2; exit 1; }
# the last epoch's weights: the measurement then depends on no choice made on any images
last_state() { ls -d "$out/$1"/dsa_moe/seed0/checkpoints/epoch* | tail -n 1; }

measure() {  # RUN CRITERION RESULT THRESHOLD...
    local state run=$1 criterion=$2 result=$3
    shift 3
    if [ -f "$out/$result.json" ]; then echo "done: $out/$result.json"; return 0; fi
    state=$(last_state "$run")
    echo "measuring $result"
    OMP_NUM_THREADS=$threads .venv/bin/timm-recursive adaptive-halting \
        --checkpoint "$state" --dataset fashion_mnist --eval-samples "$eval_samples" --timing-images 1000 --repeats 5 \
        --criterion "$criterion" --thresholds "$@" > "$out/$result.json.tmp"
    mv "$out/$result.json.tmp" "$out/$result.json"
}
measure ablation confidence confidence 0.5 0.6 0.7 0.8 0.9 0.95 0.99 0.999
measure ablation change change 0.1 0.05 0.02 0.01 0.005 0.001
halting_thresholds=(0.1 0.3 0.5 0.7 0.9 0.95 0.99)
measure ponder_net halting halting "${halting_thresholds[@]}"
for beta in $ponder_betas; do
    measure "ponder_net_beta$beta" halting "halting_beta$beta" "${halting_thresholds[@]}"
done

if [ "$save" = --save ]; then
    mkdir -p "$results"
    cp "$out/confidence.json" "$out/change.json" "$out/halting.json" "$results/"
    runs=(ablation:training ponder_net:training_ponder_net)
    for beta in $ponder_betas; do
        cp "$out/halting_beta$beta.json" "$results/"
        runs+=("ponder_net_beta$beta:training_ponder_net_beta$beta")
    done
    for run in "${runs[@]}"; do
        mkdir -p "$results/${run#*:}"
        cp "$out/${run%%:*}"/dsa_moe/seed0/{summary.json,metrics.jsonl,args.json} "$results/${run#*:}/"
    done
    .venv/bin/python "$study/plot.py" "$results"
    .venv/bin/python experiments/render.py
fi
