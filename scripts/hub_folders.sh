#!/usr/bin/env bash
# Publish-ready Hub folders (weights, config.json, model card) of the models trained in this repo,
# and their rendered cards copied to model_cards/: the FashionMNIST variants complete under ROOT
# (ROOT/recursive_<variant>_tiny as `make fashion-mnist` lays them out, or ROOT/<variant>/seed0 as
# experiments/recursion_refinement/ablations.sh does; default runs/ablations) and the demo's run (`make demo`).
# Repo ids are HUB_ORG/<arch>.<tag> (HUB_ORG from timm_recursive.hub, the one place it is defined).
# Usage: scripts/hub_folders.sh [ROOT]
# Upload one with: timm-recursive push-to-hub RUN --repo-id ORG/NAME --weights ...
set -euo pipefail
cd "$(dirname "$0")/.."
org=$(.venv/bin/python -c 'from timm_recursive.hub import HUB_ORG; print(HUB_ORG)')
export_one() {  # run folder, model name (arch.tag), weights (best|last)
    .venv/bin/python train_scripts/push_to_hub.py "$1" --repo-id "$org/$2" --weights "$3" --dry-run
    cp "$1/hub/README.md" "model_cards/$2.md"
}
complete() {  # summary.json is written when a run completes
    [ -f "$1/summary.json" ] || { echo "skipping $1: not a complete run" >&2; return 1; }
}
root=${1:-runs/ablations}
for variant in dsa_moe sa_moe sa_mlp; do
    run="$root/recursive_${variant}_tiny"
    [ -d "$run" ] || run="$root/$variant/seed0"
    # the last epoch: no model selection on the test split
    if complete "$run"; then export_one "$run" "recursive_${variant}_tiny.fashion_mnist" last; fi
done
# the demo selects its best epoch on a held-out tenth of the training split
if complete runs/demo; then export_one runs/demo recursive_dsa_moe_tiny.digits best; fi
