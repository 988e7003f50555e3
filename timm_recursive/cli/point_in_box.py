"""Point-in-Box (PiB): how much of each patch token's attention stays inside the box of its object, per block.

    timm-recursive point-in-box --compare softmax=CKPT entmax=CKPT reg4=CKPT --dataset CANVASES --out figures/pib

What it measures and how, and what ``--dataset`` may be: ``timm_recursive.analysis.point_in_box``.
"""
import os
from typing import Dict

import torch

from timm_recursive.analysis.point_in_box import (
    DEFINITION,
    compose_boxes,
    load_canvases,
    patch_box_ids,
    point_in_box,
    write_plot,
)
from timm_recursive.runs.files import write_json_atomic


def measure(args, checkpoints: Dict[str, str]) -> Dict:
    """The ``point_in_box`` of every backbone on the same canvases, as written to ``point_in_box.json``."""
    from timm.data import create_transform

    from timm_recursive.data import image_mode, resolve_model_data_config, to_pil
    from timm_recursive.runs import create_model_from_checkpoint

    models = {name: create_model_from_checkpoint(checkpoint, num_classes=0).eval()
              for name, checkpoint in checkpoints.items()}
    canvases, masks, source = load_canvases(args.dataset, args.num_images, args.grid, args.threshold, args.seed)
    if masks.shape[1] != masks.shape[2]:
        raise ValueError(f'canvases of {masks.shape[1]}x{masks.shape[2]} pixels: square canvases only')
    boxes = compose_boxes(masks, args.grid, args.box)
    config = resolve_model_data_config(next(iter(models.values())))
    img_size = args.img_size or config['input_size'][-1]
    # crop_pct 1: the whole (square) canvas resized, so the boxes keep their place
    config.update(input_size=(config['input_size'][0], img_size, img_size), crop_pct=1.0)
    transform = create_transform(**config)
    images = torch.stack([transform(to_pil(canvas, image_mode(config))) for canvas in canvases])
    backbones = {}
    for name, model in models.items():
        if img_size != model.patch_embed.img_size[0] and not getattr(model, 'dynamic_img_size', False):
            model.set_input_size(img_size=(img_size, img_size))  # interpolates the position embedding
        box_ids = patch_box_ids(boxes, masks.shape[1:], model.patch_embed.dynamic_feat_size((img_size, img_size)))
        batches = ((images[i:i + args.batch_size], box_ids[i:i + args.batch_size])
                   for i in range(0, len(images), args.batch_size))
        backbones[name] = {'checkpoint': checkpoints[name], 'architecture': model.pretrained_cfg.get('architecture'),
                           'num_prefix_tokens': model.num_prefix_tokens, **point_in_box(model, batches)}
    return {'dataset': args.dataset, 'source': source, 'canvases': len(canvases), 'grid': args.grid, 'box': args.box,
            'img_size': img_size, 'definition': DEFINITION, 'backbones': backbones}


def main(argv=None) -> int:
    import timm_recursive  # noqa: F401  registers the models
    from timm_recursive.cli.args import CommandParser, positive_int
    from timm_recursive.cli.common import status_of
    parser = CommandParser(description='Point-in-Box: per block, the share of patch attention inside '
                                       'the object box of the patch, for several ViT backbones')
    parser.add_argument('--compare', nargs='+', required=True, metavar='NAME=CHECKPOINT',
                        help='backbones (exported folders, run folders), as they are')
    parser.add_argument('--dataset', required=True,
                        help='a folder of compose canvases (image, mask) or a classification dataset to compose')
    parser.add_argument('--out', required=True, help='folder for point_in_box.json and point_in_box.png')
    parser.add_argument('--num-images', type=positive_int, default=64, help='canvases measured')
    parser.add_argument('--grid', type=positive_int, default=2, help='tiles per canvas side')
    parser.add_argument('--box', choices=('foreground', 'tile'), default='foreground',
                        help="a tile's box: its foreground's bounding box, or the tile")
    parser.add_argument('--threshold', type=int, default=32, help='composing: foreground pixels are brighter')
    parser.add_argument('--seed', type=int, default=0, help='composing: which images go where')
    parser.add_argument('--img-size', type=positive_int, default=None, help='square input size')
    parser.add_argument('--batch-size', type=positive_int, default=16)
    args = parser.parse_args(argv)
    checkpoints = {}
    for spec in args.compare:
        name, sep, checkpoint = spec.partition('=')
        if not sep or not name or name in checkpoints:
            parser.error(f'--compare takes distinct NAME=CHECKPOINT, got {spec!r}')
        checkpoints[name] = checkpoint

    def run() -> int:
        result = measure(args, checkpoints)
        for name, backbone in result['backbones'].items():
            for block, (pib, chance) in enumerate(zip(backbone['pib'], backbone['chance'])):
                print(f'{name} block {block:2d}: PiB {pib:.3f} (chance {chance:.3f})')
        os.makedirs(args.out, exist_ok=True)
        write_json_atomic(os.path.join(args.out, 'point_in_box.json'), result)
        write_plot(result['backbones'], os.path.join(args.out, 'point_in_box.png'))
        print(f'wrote {args.out}/point_in_box.json and point_in_box.png')
        return 0

    return status_of(run)
