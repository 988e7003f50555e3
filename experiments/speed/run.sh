#!/usr/bin/env bash
# The speed study: every benchmark of benchmarks/ with the settings of the committed results, each
# writing its JSON into a fresh folder, plus provenance.json (date, commit, machine, wall time of each).
# Usage: experiments/speed/run.sh OUTPUT_DIR [BENCHMARK ...]
#   BENCHMARK: efficiency entmax_speed entmax_speed_1thread recursive_train_speed recursive_train_speed_b128
#   recursive_train_speed_b256 layer_floor token_fusion_cost compile_speed spatial_train_speed tome_cost tome_families (default: all;
#   the spatial recursion study's training images/s, at 16 steps on 28 px, with OMP_NUM_THREADS=1; compile_speed took 76 min
#   of wall time here; the throughput study ran recursive_train_speed_b* with OMP_NUM_THREADS=1).
#   OUTPUT_DIR must not exist: a run never overwrites another.
# The committed results are updated only by copying the run's folder:  cp -r OUTPUT_DIR experiments/speed/results/
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 OUTPUT_DIR [BENCHMARK ...]" >&2; exit 2; }
out="$1"; shift
[ ! -e "$out" ] || { echo "error: $out exists; give a fresh folder (runs are never overwritten)" >&2; exit 2; }
py="${PYTHON:-$root/.venv/bin/python}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$root/.cache/torch_extensions}"

declare -A commands=(
    [efficiency]="-m timm_recursive.cli efficiency recursive_sa_mlp_cifar recursive_sa_moe_cifar recursive_dsa_moe_cifar recursive_dsa_moe_cifar:topk=2 --json"
    [entmax_speed]="benchmarks/entmax_speed.py --json --repeats 7"
    [entmax_speed_1thread]="benchmarks/entmax_speed.py --json --repeats 7 --threads 1"
    [recursive_train_speed]="benchmarks/recursive_train_speed.py --json --batch-size 64 --repeats 3 --warmup 1 --models recursive_sa_mlp_cifar recursive_sa_moe_cifar recursive_dsa_moe_cifar recursive_sa_mlp_cifar:grad_window=0 recursive_dsa_moe_cifar:grad_window=0"
    [recursive_train_speed_b128]="benchmarks/recursive_train_speed.py --json --batch-size 128 --repeats 5 --warmup 1 --models recursive_sa_mlp_cifar recursive_dsa_moe_cifar"
    [recursive_train_speed_b256]="benchmarks/recursive_train_speed.py --json --batch-size 256 --repeats 5 --warmup 1 --models recursive_sa_mlp_cifar recursive_dsa_moe_cifar"
    [layer_floor]="benchmarks/layer_floor.py --json --repeats 3 --threads 1"
    [token_fusion_cost]="benchmarks/token_fusion_cost.py --json --repeats 5 --batch-sizes 1 32 128 --keep-rates 0.5 0.6 0.673 0.7 0.8"
    [compile_speed]="benchmarks/compile_speed.py --json"
    [tome_cost]="benchmarks/token_fusion_cost.py --json --repeats 5 --batch-sizes 1 32 128 --keep-rates 0.673 0.7 --tome-r 13 16 --train-batch-sizes 32"
    [tome_families]="benchmarks/token_fusion_cost.py --json --repeats 5 --batch-sizes 1 32 --keep-rates --tome-r 13 16 --families"
    [spatial_train_speed]="benchmarks/recursive_train_speed.py --json --batch-size 128 --repeats 5 --warmup 1 --models recursive_sa_mlp_spatial_tiny.fashion_mnist:in_chans=1,num_steps=16 recursive_sa_moe_spatial_tiny.fashion_mnist:in_chans=1,num_steps=16 recursive_dsa_moe_spatial_tiny.fashion_mnist:in_chans=1,num_steps=16,topk=2 recursive_dsa_moe_spatial_tiny.fashion_mnist:in_chans=1,num_steps=16 recursive_dsa_moe_spatial_tiny.fashion_mnist:in_chans=1,num_steps=16,topk=16"
)
selected=("$@")
[ ${#selected[@]} -gt 0 ] || selected=(efficiency entmax_speed entmax_speed_1thread recursive_train_speed
                                       recursive_train_speed_b128 recursive_train_speed_b256 layer_floor
                                       token_fusion_cost compile_speed spatial_train_speed tome_cost tome_families)
for name in "${selected[@]}"; do
    [ -n "${commands[$name]:-}" ] || { echo "error: unknown benchmark $name (known: ${!commands[*]})" >&2; exit 2; }
done

mkdir -p "$out"
cd "$root"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- benchmarks timm_recursive || commit="$commit (with uncommitted changes)"
walls=()
for name in "${selected[@]}"; do
    echo "+ python ${commands[$name]} > $out/$name.json" >&2
    start=$(date +%s)
    # shellcheck disable=SC2086  # the command is a word list
    "$py" ${commands[$name]} > "$out/$name.json.tmp"
    mv "$out/$name.json.tmp" "$out/$name.json"
    walls+=("\"$name\": {\"command\": \"python ${commands[$name]}\", \"wall_s\": $(($(date +%s) - start))}")
done
cat > "$out/provenance.json" <<JSON
{
  "started": "$started",
  "commit": "$commit",
  "machine": "$(uname -m), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)",
  "omp_num_threads": "${OMP_NUM_THREADS:-unset}",
  "benchmarks": {$(IFS=,; echo "${walls[*]}")}
}
JSON
echo "wrote $out" >&2
