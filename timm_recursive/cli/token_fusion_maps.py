"""Which patches a token-fusion ViT kept and which it fused into which cluster, at every reduction; or, with
``--mode tome``, ToMe's merge groups drawn over the image.

``timm-recursive token-fusion-maps --model deit_s_tokenfuse [--pretrained] [--mode tome --r 13] --out DIR``

What it measures and how: ``timm_recursive.analysis.token_fusion_maps``.
"""

from timm_recursive.analysis.token_fusion_maps import token_fusion_maps
from timm_recursive.cli.args import CommandParser
from timm_recursive.layers import FUSION_MODES, TOME_MODE


def main(argv=None) -> int:
    import timm_recursive  # noqa: F401

    parser = CommandParser(description='Which patches a token-fusion ViT keeps and fuses, as PNG maps')
    parser.add_argument('--model', default='deit_s_tokenfuse', help='model name (any timm ViT gets token fusion)')
    parser.add_argument('--pretrained', action='store_true')
    parser.add_argument('--mode', default='both', choices=FUSION_MODES + (TOME_MODE,),
                        help="'tome': draw ToMe's merge groups (each group one colour) instead")
    parser.add_argument('--keep-rate', type=float, default=0.7)
    parser.add_argument('--num-fused-tokens', type=int, default=2)
    parser.add_argument('--r', type=int, default=13, help="--mode tome: tokens merged per block")
    parser.add_argument('--images', nargs='*', default=[],
                        help="image files (default: scikit-learn's bundled china.jpg and flower.jpg)")
    parser.add_argument('--out', required=True)
    args = parser.parse_args(argv)

    lines = token_fusion_maps(args.model, args.out, args.images, args.pretrained, args.mode, args.keep_rate,
                              args.num_fused_tokens, args.r)
    print('\n'.join(lines))
    if not args.pretrained:
        print('note: random weights (no --pretrained): the maps show the mechanics, not what a trained DeiT attends to')
    print(f'wrote the maps (PNG) and their JSON summary under {args.out}')
    return 0
