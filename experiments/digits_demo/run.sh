#!/usr/bin/env bash
# The digits demo (`make demo`) into a fresh folder: trains, shows the steps, exports, reloads and checks.
# Usage: experiments/digits_demo/run.sh OUTPUT_DIR   (OUTPUT_DIR must not exist: a run never overwrites another)
# The committed results are updated only by copying from OUTPUT_DIR:
#   cp OUTPUT_DIR/{summary.json,metrics.jsonl,args.json} experiments/digits_demo/results/
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -eq 1 ] || { echo "usage: $0 OUTPUT_DIR" >&2; exit 2; }
[ ! -e "$1" ] || { echo "error: $1 exists; give a fresh folder (runs are never overwritten)" >&2; exit 2; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
"${PYTHON:-$root/.venv/bin/python}" "$root/train_scripts/demo.py" --output "$1"
