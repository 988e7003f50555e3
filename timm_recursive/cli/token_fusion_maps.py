"""Which patches a token-fusion ViT kept and which it fused into which cluster, at every reduction.

``timm-recursive token-fusion-maps --model deit_s_tokenfuse [--pretrained]

What it measures and how: ``timm_recursive.analysis.token_fusion_maps``.
"""
import argparse

from timm_recursive.analysis.images import load_images
from timm_recursive.analysis.token_fusion_maps import write_maps
from timm_recursive.layers import apply_token_fusion


def main(argv=None) -> int:
    import timm
    from timm.data import resolve_data_config

    import timm_recursive  # noqa: F401

    parser = argparse.ArgumentParser(description='Which patches a token-fusion ViT keeps and fuses, as PNG maps')
    parser.add_argument('--model', default='deit_s_tokenfuse', help='model name (any timm ViT gets token fusion)')
    parser.add_argument('--pretrained', action='store_true')
    parser.add_argument('--keep-rate', type=float, default=0.7)
    parser.add_argument('--num-fused-tokens', type=int, default=2)
    parser.add_argument('--images', nargs='*', default=[],
                        help="image files (default: scikit-learn's bundled china.jpg and flower.jpg)")
    parser.add_argument('--out', required=True)
    args = parser.parse_args(argv)

    model = timm.create_model(args.model, pretrained=args.pretrained)
    apply_token_fusion(model, keep_rate=args.keep_rate, num_fused_tokens=args.num_fused_tokens)
    config = resolve_data_config(model=model)
    stages = write_maps(model.eval(), load_images(args.images, config), args.out, config)
    for s in stages:
        print(f'block {s["block"] + 1}: kept {s["num_kept"]}, fused {s["num_fused_inputs"]} tokens into '
              f'{s["sizes"].shape[1] - s["num_kept"]}')
    if not args.pretrained:
        print('note: random weights (no --pretrained): the maps show the mechanics, not what a trained DeiT attends to')
    print(f'wrote {args.out}/token_fusion_*.png and token_fusion.json')
    return 0
