"""What entmax attention does inside a ViT: sparsity per layer and head, and PCA maps of patch features.

``timm-recursive attention-maps --model vit_small_entmax --out DIR`` writes

What it measures and how: ``timm_recursive.analysis.attention_maps``.
"""
import os
from typing import Dict

from timm_recursive.analysis.attention_maps import (
    attention_sparsity,
    write_pca_comparison,
    write_report,
)
from timm_recursive.analysis.images import dataset_images, load_images
from timm_recursive.cli.args import CommandParser
from timm_recursive.layers import EntmaxAttention
from timm_recursive.runs.files import write_json_atomic


def print_sparsity(stats: Dict[str, list], prefix: str = '') -> None:
    for layer, (zeros, heads) in enumerate(zip(stats['zero_fraction'], stats['support_per_head'])):
        print(f'{prefix}layer {layer:2d}: {100 * zeros:5.1f}% zeros, keys kept per head '
              + ' '.join(f'{h:.0f}' for h in heads))


def compare_main(args) -> int:
    """``--compare NAME=CHECKPOINT ...``: the side-by-side PCA figure of several backbones on the same images,
    and the attention sparsity of the entmax ones."""
    from timm_recursive.data import resolve_model_data_config
    from timm_recursive.runs import create_model_from_checkpoint

    models = {}
    for spec in args.compare:
        name, sep, checkpoint = spec.partition('=')
        if not sep:
            raise SystemExit(f'error: --compare takes NAME=CHECKPOINT, got {spec!r}')
        models[name] = create_model_from_checkpoint(checkpoint, num_classes=0).eval()
    config = resolve_model_data_config(next(iter(models.values())))
    if args.img_size:
        config.update(input_size=(config['input_size'][0], args.img_size, args.img_size), crop_pct=1.0)
    images = (dataset_images(args.dataset, args.num_images, config) if args.dataset
              else load_images(args.images, config))
    path = os.path.join(args.out, 'pca_compare.png')
    write_pca_comparison(models, images, path, config)
    # the sparsity of the trained entmax backbones on the same images (softmax has no exact zeros to count)
    sparsity = {name: attention_sparsity(model, images) for name, model in models.items()
                if any(isinstance(m, EntmaxAttention) for m in model.modules())}
    for name, stats in sparsity.items():
        print_sparsity(stats, f'{name} ')
    if sparsity:
        write_json_atomic(os.path.join(args.out, 'sparsity.json'), sparsity)
    print(f'wrote {path}' + (f' and {os.path.join(args.out, "sparsity.json")}' if sparsity else ''))
    return 0


def main(argv=None) -> int:
    import timm
    from timm.data import resolve_data_config

    import timm_recursive  # noqa: F401

    parser = CommandParser(description='Entmax attention sparsity and PCA feature maps of a ViT')
    parser.add_argument('--model', default='vit_small_entmax', help='model name (any timm ViT is converted)')
    parser.add_argument('--pretrained', action='store_true')
    parser.add_argument('--alpha', type=float, default=1.5)
    parser.add_argument('--images', nargs='*', default=[],
                        help="image files (default: scikit-learn's bundled china.jpg and flower.jpg)")
    parser.add_argument('--out', required=True)
    parser.add_argument('--compare', nargs='+', default=None, metavar='NAME=CHECKPOINT',
                        help='side-by-side PCA maps of these backbones (exported folders), as they are (no conversion)')
    parser.add_argument('--dataset', default=None,
                        help='with --compare: take the images from this dataset\'s eval split')
    parser.add_argument('--num-images', type=int, default=4)
    parser.add_argument('--img-size', type=int, default=None, help='with --compare: square input size')
    args = parser.parse_args(argv)
    if args.compare:
        return compare_main(args)

    from timm_recursive.layers import convert_to_entmax
    model = convert_to_entmax(timm.create_model(args.model, pretrained=args.pretrained), args.alpha).eval()
    config = resolve_data_config(model=model)
    images = load_images(args.images, config)
    print_sparsity(write_report(model, images, args.out, config))
    print(f'wrote {args.out}/sparsity.json, sparsity.png and pca_*.png')
    return 0
