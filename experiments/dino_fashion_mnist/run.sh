#!/usr/bin/env bash
# The DINO study (experiments/dino_fashion_mnist): softmax, entmax-1.5, register-4 and [CLS]/patch-specialized
# ViTs (width 192, depth 4, patch 4) pretrained with one recipe (train_dino.py --preset cpu28) on the first
# $IMAGES FashionMNIST training images (the Debian package's IDX files, or the Hub dataset), then frozen-feature
# probes: DINO's linear probe ([CLS] of the last 4 blocks) on FashionMNIST; per block, dense linear segmentation
# and depth on 2x2 canvases of FashionMNIST images (probe.py compose --depth: foreground pixels carry their
# image's class; a synthetic depth map, see docs/dino_and_probes.md), segmentation with and without [CLS]
# concatenated, depth with it (the source's depth protocol); then the side-by-side PCA figure and the entmax
# backbone's attention sparsity (attention_maps), Point-in-Box per block (point_in_box) and
# OUTPUT_ROOT/results.json (collect.py).
# The four variants train at the same time (one thread each). Nothing finished is redone or overwritten: a
# stopped pretraining resumes from its last saved state, and a probe whose JSON exists is skipped.
# Usage: experiments/dino_fashion_mnist/run.sh [OUTPUT_ROOT]
#   (IMAGES, EPOCHS, CANVASES, LINEAR_IMAGES, PROBE_EPOCHS override the sizes; VARIANTS the variants run)
# The committed results are updated only by copying from OUTPUT_ROOT:
#   cp OUTPUT_ROOT/{results.json,pca_compare.png,point_in_box.png} experiments/dino_fashion_mnist/results/
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/dino_fashion_mnist}
images=${IMAGES:-6000}
epochs=${EPOCHS:-6}
canvases=${CANVASES:-600}
linear_images=${LINEAR_IMAGES:-5000}
probe_epochs=${PROBE_EPOCHS:-50}
variants=(${VARIANTS:-softmax entmax reg4 specialized})
cli=".venv/bin/timm-recursive"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions"
mkdir -p "$out"
layers=(0 1 2 3)

[ -d "$out/canvases" ] || $cli probe compose --dataset fashion_mnist --out "$out/canvases" \
    --train-canvases "$canvases" --eval-canvases $((canvases / 2)) --depth

declare -A models=([softmax]="vit_small_patch16_224" [entmax]="vit_small_entmax" [reg4]="vit_small_patch16_224"
                   [specialized]="vit_small_specialized")
declare -A extra=([softmax]="" [entmax]="" [reg4]="reg_tokens=4" [specialized]="")
for variant in "${variants[@]}"; do
    (
        $cli train-dino --preset cpu28 --model "${models[$variant]}" \
            --model-kwargs img_size=28 patch_size=4 embed_dim=192 depth=4 num_heads=3 ${extra[$variant]} \
            --dataset fashion_mnist --max-train-samples "$images" --epochs "$epochs" \
            --output "$out/$variant" --resume --no-progress
        probe=(--checkpoint "$out/$variant/model" --no-progress)
        [ -f "$out/$variant/linear.json" ] || $cli probe linear "${probe[@]}" \
            --dataset fashion_mnist --n-last-blocks 4 --max-train-samples "$linear_images" \
            --output "$out/$variant/linear.json"
        dense=("${probe[@]}" --dataset "$out/canvases" --img-size 56 --epochs "$probe_epochs" --layers "${layers[@]}")
        [ -f "$out/$variant/segment.json" ] || $cli probe segment "${dense[@]}" \
            --output "$out/$variant/segment.json"
        [ -f "$out/$variant/segment_cls.json" ] || $cli probe segment "${dense[@]}" --with-cls \
            --output "$out/$variant/segment_cls.json"
        [ -f "$out/$variant/depth_cls.json" ] || $cli probe depth "${dense[@]}" --with-cls \
            --output "$out/$variant/depth_cls.json"
    ) > "$out/$variant.log" 2>&1 &
done
wait

compare=()
for variant in "${variants[@]}"; do compare+=("$variant=$out/$variant/model"); done
$cli attention-maps --compare "${compare[@]}" --dataset "$out/canvases" --num-images 4 \
    --img-size 56 --out "$out"
$cli point-in-box --compare "${compare[@]}" --dataset "$out/canvases" --num-images 64 \
    --img-size 56 --out "$out"
.venv/bin/python experiments/dino_fashion_mnist/collect.py "$out"
