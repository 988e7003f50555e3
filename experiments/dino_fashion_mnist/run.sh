#!/usr/bin/env bash
# The DINO study (experiments/dino_fashion_mnist): softmax, entmax-1.5 and register-4 ViTs (width 192,
# depth 4, patch 4) pretrained with one recipe (train_dino.py --preset cpu28) on the first $IMAGES FashionMNIST training images (the
# Debian package's IDX files, or the Hub dataset), then frozen-feature probes: linear classification on
# FashionMNIST, and dense linear segmentation on 2x2 canvases of FashionMNIST test/train images whose
# foreground pixels carry their image's class (probe.py compose), with and without [CLS] concatenated;
# finally the side-by-side PCA figure, the entmax backbone's measured attention sparsity (sparsity.json) and
# OUTPUT_ROOT/results.json (collect.py). The three variants train
# at the same time (one thread each); a stopped run resumes from its last saved state when rerun.
# Usage: experiments/dino_fashion_mnist/run.sh [OUTPUT_ROOT]   (IMAGES, EPOCHS, CANVASES, LINEAR_IMAGES override the sizes)
# The committed results are updated only by copying from OUTPUT_ROOT:
#   cp OUTPUT_ROOT/{results.json,pca_compare.png} experiments/dino_fashion_mnist/results/
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/dino_fashion_mnist}
images=${IMAGES:-2000}
epochs=${EPOCHS:-3}
canvases=${CANVASES:-600}
linear_images=${LINEAR_IMAGES:-5000}
py=".venv/bin/python"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions"
mkdir -p "$out"

[ -d "$out/canvases" ] || nice -n 15 $py train_scripts/probe.py compose --dataset fashion_mnist --out "$out/canvases" \
    --train-canvases "$canvases" --eval-canvases $((canvases / 2))

declare -A models=([softmax]="vit_small_patch16_224" [entmax]="vit_small_entmax" [reg4]="vit_small_patch16_224")
declare -A extra=([softmax]="" [entmax]="" [reg4]="reg_tokens=4")
for variant in softmax entmax reg4; do
    (
        nice -n 15 $py train_scripts/train_dino.py --preset cpu28 --model "${models[$variant]}" \
            --model-kwargs img_size=28 patch_size=4 embed_dim=192 depth=4 num_heads=3 ${extra[$variant]} \
            --dataset fashion_mnist --max-train-samples "$images" --epochs "$epochs" \
            --output "$out/$variant" --resume --no-progress
        probe=(--checkpoint "$out/$variant/model" --no-progress)
        nice -n 15 $py train_scripts/probe.py linear "${probe[@]}" --dataset fashion_mnist \
            --max-train-samples "$linear_images" --output "$out/$variant/linear.json"
        for cls in "" "--with-cls"; do
            nice -n 15 $py train_scripts/probe.py segment "${probe[@]}" --dataset "$out/canvases" --img-size 56 \
                --epochs 50 $cls --output "$out/$variant/segment${cls:+_cls}.json"
        done
    ) > "$out/$variant.log" 2>&1 &
done
wait

nice -n 15 $py -m timm_recursive.analysis.attention_maps --compare softmax="$out/softmax/model" \
    entmax="$out/entmax/model" reg4="$out/reg4/model" --dataset "$out/canvases" --num-images 4 --img-size 56 --out "$out"
$py experiments/dino_fashion_mnist/collect.py "$out"
