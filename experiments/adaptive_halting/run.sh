#!/usr/bin/env bash
# Adaptive halting (issue 23) of the reference tiny DSA-MoE on FashionMNIST: does stopping each
# image at its own step keep the 16-step accuracy for less compute?
#   1. trains the reference model (seed 0) exactly as the ablations do (first 6,000 training images,
#      4 epochs; resumes, skipped once finished) into OUTPUT_ROOT/ablation/dsa_moe/seed0, and the same
#      model with a learned halting head trained by PonderNet's objective (--halting ponder_net in
#      place of deep supervision) into OUTPUT_ROOT/ponder_net/dsa_moe/seed0;
#   2. measures the confidence and change exits on the reference model and the learned head's exit on
#      the PonderNet model, with each run's last epoch's weights on the first 5,000 test images, into
#      OUTPUT_ROOT/<criterion>.json
#      (python -m timm_recursive.analysis.adaptive_halting; a measurement already there is kept);
#   3. with --save, copies the measurements and both runs' records into experiments/adaptive_halting/
#      results/ and draws the figure there (the only step that changes results/).
# Usage: experiments/adaptive_halting/run.sh OUTPUT_ROOT [--save]
# Threads per process: HALTING_THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/adaptive_halting
out=${1:?usage: $study/run.sh OUTPUT_ROOT [--save]}
save=${2:-}
threads=${HALTING_THREADS:-2}
# the recursion study's recipe (one script trains every run of that recipe)
ablations=experiments/recursion_refinement/ablations.sh

ABLATION_ONLY=dsa_moe/seed0 ABLATION_THREADS=$threads "$ablations" "$out/ablation" 1
ABLATION_ONLY=dsa_moe/seed0 ABLATION_THREADS=$threads "$ablations" "$out/ponder_net" 1 --halting ponder_net
# the last epoch's weights: a run's model/ export is its best epoch on the test images
last_state() { ls -d "$out/$1"/dsa_moe/seed0/checkpoints/epoch* | tail -n 1; }

measure() {  # RUN CRITERION THRESHOLD...
    local state criterion=$2
    state=$(last_state "$1")
    shift 2
    if [ -f "$out/$criterion.json" ]; then echo "done: $out/$criterion.json"; return 0; fi
    echo "measuring $criterion"
    OMP_NUM_THREADS=$threads .venv/bin/python -m timm_recursive.analysis.adaptive_halting \
        --checkpoint "$state" --dataset fashion_mnist --eval-samples 5000 --timing-images 1000 --repeats 5 \
        --criterion "$criterion" --thresholds "$@" > "$out/$criterion.json.tmp"
    mv "$out/$criterion.json.tmp" "$out/$criterion.json"
}
measure ablation confidence 0.5 0.6 0.7 0.8 0.9 0.95 0.99 0.999
measure ablation change 0.1 0.05 0.02 0.01 0.005 0.001
measure ponder_net halting 0.1 0.3 0.5 0.7 0.9 0.95 0.99

if [ "$save" = --save ]; then
    cp "$out/confidence.json" "$out/change.json" "$out/halting.json" "$study/results/"
    for run in ablation:training ponder_net:training_ponder_net; do
        mkdir -p "$study/results/${run#*:}"
        cp "$out/${run%%:*}"/dsa_moe/seed0/{summary.json,metrics.jsonl,args.json} "$study/results/${run#*:}/"
    done
    .venv/bin/python "$study/plot.py"
    .venv/bin/python experiments/render.py
fi
