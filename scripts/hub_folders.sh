#!/usr/bin/env bash
# Publish-ready Hub folders (weights, config.json, model card) of the models trained in this repo, and their
# cards kept in model_cards/ beside the run records they are rendered from (model_cards/runs/<arch.tag>/, which
# `python experiments/render.py --check` renders again and compares): the FashionMNIST baselines' seed-0 runs
# (experiments/fashion_mnist_baselines/train.sh ROOT: ROOT/recursive_<variant>_tiny/seed0, default
# runs/fashion_mnist), the digits demo's run (experiments/digits_demo/run.sh runs/digits_demo) and, of the FashionMNIST
# zoo's small recursive models (experiments/fashion_mnist_zoo/run.py, runs/fashion_mnist_zoo), each variant's seed
# with the highest held-out top-1, once experiments/fashion_mnist_zoo/checkpoints.py has checked its weights.
# Every card publishes the epoch chosen on held-out training images (--weights best).
# Repo ids are HUB_ORG/<arch>.<tag> (HUB_ORG from timm_recursive.runs, the one place it is defined).
# Usage: scripts/hub_folders.sh [ROOT]
# Upload one with: timm-recursive push-to-hub RUN --repo-id ORG/NAME --weights best
set -euo pipefail
cd "$(dirname "$0")/.."
org=$(.venv/bin/python -c 'from timm_recursive.runs import HUB_ORG; print(HUB_ORG)')
export_one() {  # run folder, model name (arch.tag)
    [ -f "$1/summary.json" ] || { echo "skipping $1: not a complete run" >&2; return 0; }
    .venv/bin/timm-recursive push-to-hub "$1" --repo-id "$org/$2" --weights best --dry-run
    .venv/bin/python tools/model_cards.py save "$1" "$1/hub" "$2" --repo-id "$org/$2" --weights best
}
root=${1:-runs/fashion_mnist}
for variant in dsa_moe sa_mlp; do
    export_one "$root/recursive_${variant}_tiny/seed0" "recursive_${variant}_tiny.fashion_mnist"
done
export_one runs/digits_demo recursive_dsa_moe_tiny.digits
# the zoo's runs that experiments/fashion_mnist_zoo/checkpoints.py checked and published (results/checkpoints/)
for check in experiments/fashion_mnist_zoo/results/checkpoints/*/check.json; do
    [ -f "$check" ] || continue
    run=$(.venv/bin/python -c 'import json, sys; r = json.load(open(sys.argv[1])); print("%s/seed%d" % (r["cell"], r["seed"]))' "$check")
    export_one "runs/fashion_mnist_zoo/$run" "$(basename "$(dirname "$check")")"
done
