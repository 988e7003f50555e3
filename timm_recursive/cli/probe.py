"""Frozen-feature probes of a ViT backbone (``timm_recursive.analysis.probing``), as the source measures DINO models.

    # linear classification on the [CLS] token(s)
    timm-recursive-probe linear --checkpoint runs/dino_entmax/model --dataset fashion_mnist
    # dense linear segmentation on patch features (+ [CLS] with --with-cls), mIoU
    timm-recursive-probe segment --checkpoint runs/dino_entmax/model --dataset data/fm_canvases
    timm-recursive-probe segment --model vit_small_patch16_224.dino --pretrained \\
        --dataset scene_parse_150 --reduce-zero-label --img-size 448
    # VOC 2012 and Cityscapes from their official folders, read by torchvision
    timm-recursive-probe segment --checkpoint runs/dino_entmax/model --dataset torch/voc2012 --data-dir data/voc \\
        --num-classes 21
    timm-recursive-probe segment --checkpoint runs/dino_entmax/model --dataset torch/cityscapes \\
        --data-dir data/cityscapes --num-classes 19
    # one probe per block (the layer-by-layer analysis): mIoU of blocks 0, 3, 7 and the last
    timm-recursive-probe segment --checkpoint runs/dino_entmax/model --dataset data/fm_canvases --layers 0 3 7 -1
    # dense linear depth on patch features, RMSE / AbsRel / delta1 (NYUv2-style 16-bit PNGs in millimetres)
    timm-recursive-probe depth --checkpoint runs/dino_entmax/model --dataset data/nyu --depth-scale 1000 \
        --max-depth 10 --img-size 448
    # a segmentation dataset from a classification one: grids of images, foreground pixels labelled by class
    # (--depth: with a depth map set by those labels, for the depth probe)
    timm-recursive-probe compose --dataset fashion_mnist --out data/fm_canvases --depth

The backbone is ``--checkpoint`` (an exported folder such as ``train_dino.py``'s ``model/``, a run or
state folder) or ``--model`` (with ``--pretrained``); it is built with ``num_classes=0`` and stays frozen.
Segmentation datasets: a Hub id or local folder with an image column and a per-pixel mask column
(``mask``, ``annotation`` as in ADE20K, ...), or ``torch/voc2012`` (``--data-dir`` holds
``VOCdevkit/VOC2012``) and ``torch/cityscapes`` (``--data-dir`` holds ``leftImg8bit/`` and ``gtFine/``; masks
as the 19 train ids, 255 void); masks and images are resized to ``--img-size`` (nearest for masks) and mIoU
is computed at that resolution. Depth datasets: a Hub id or local folder with an image column and a per-pixel
depth column (``depth``, ``depth_map``; float arrays, or 16-bit PNGs divided by ``--depth-scale``), resized
to ``--img-size`` (nearest, so missing values stay 0) and scored at that resolution over the pixels with
0 < depth <= ``--max-depth``. The result is printed and written to ``--results-file``.
"""
import argparse
import json
import sys
import time

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.probe_runs import ProbeError, run_probe
from timm_recursive.cli.args import (
    DATASET_HELP,
    CommandParser,
    add_data_arguments,
    add_model_arguments,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from timm_recursive.data import DatasetError
from timm_recursive.runs.checkpoint import CheckpointError
from timm_recursive.runs.files import DestinationError, write_results_file


def add_probe_arguments(p) -> None:
    add_model_arguments(p.add_argument_group('backbone'))
    g = p.add_argument_group('data')
    add_data_arguments(g, required=True, dataset_help=DATASET_HELP + '; segment also reads torch/voc2012 (the folder '
                       'of VOCdevkit/ in --data-dir) and torch/cityscapes (of leftImg8bit/ and gtFine/)')
    g.add_argument('--max-train-samples', type=positive_int, default=None)
    g.add_argument('--max-eval-samples', type=positive_int, default=None)
    g.add_argument('-b', '--batch-size', type=positive_int, default=128, help='feature extraction batch')
    g.add_argument('-j', '--workers', type=non_negative_int, default=0, help='data loader worker processes')
    g = p.add_argument_group('probe training (on cached features)')
    g.add_argument('--epochs', type=positive_int, default=100)
    g.add_argument('--lr', type=non_negative_float, default=1e-3)
    g.add_argument('--weight-decay', type=non_negative_float, default=0.)
    g.add_argument('--probe-batch-size', type=positive_int, default=256)
    g.add_argument('--seed', type=int, default=0)
    g.add_argument('--results-file', '--output', dest='results_file', default=None,
                   help='JSON file of the result (timm validate.py\'s name; --output, the old one, names '
                        'folders in the other commands)')
    g.add_argument('--layers', '--layer', dest='layers', type=int, nargs='+', default=None,
                   help='probe the output of these blocks (0-based, negative from the end), one probe per block '
                        'from one feature extraction (default: the last block)')
    g.add_argument('--no-progress', action='store_true')


def add_dense_arguments(p) -> None:
    """The options of the dense probes (segment, depth)."""
    p.add_argument('--img-size', type=positive_int, default=None,
                   help='square probe resolution (default: the model\'s)')
    p.add_argument('--with-cls', action='store_true', help='concatenate the [CLS] token to every patch feature')


def parse_args(argv=None):
    p = CommandParser(description=__doc__.split('\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=__doc__.split('\n', 1)[1])
    sub = p.add_subparsers(dest='command', required=True)
    linear = sub.add_parser('linear', help='linear classification probe on [CLS] features')
    add_probe_arguments(linear)
    linear.add_argument('--n-last-blocks', type=positive_int, default=1,
                        help='concatenate the [CLS] of the last N blocks (DINO uses 4 for ViT-S)')
    linear.add_argument('--avgpool-patches', action='store_true', help='append the mean patch token of the last block')
    segment = sub.add_parser('segment',
                             help='dense linear segmentation probe on patch features (mIoU)')
    add_probe_arguments(segment)
    segment.add_argument('--mask-column', default=None)
    segment.add_argument('--num-classes', type=int, default=None, help='default: the largest label in the masks + 1')
    segment.add_argument('--ignore-index', type=int, default=255, help='label excluded from training and mIoU')
    segment.add_argument('--reduce-zero-label', action='store_true',
                         help='ADE20K convention: label 0 is "other" (ignored), the rest shift down by one')
    add_dense_arguments(segment)
    depth = sub.add_parser('depth',
                           help='dense linear depth probe on patch features (RMSE, AbsRel, delta1)')
    add_probe_arguments(depth)
    add_dense_arguments(depth)
    depth.add_argument('--depth-column', default=None)
    depth.add_argument('--depth-scale', type=positive_float, default=1.,
                       help='stored value per depth unit: 1000 for NYUv2\'s millimetre PNGs, 256 for KITTI\'s')
    depth.add_argument('--max-depth', type=positive_float, default=None,
                       help='score and train on pixels of depth <= this only (after --depth-scale)')
    compose = sub.add_parser('compose', help='segmentation canvases from a classification dataset')
    compose.add_argument('--dataset', required=True)
    compose.add_argument('--out', required=True, help='save_to_disk folder to write (train and test splits)')
    compose.add_argument('--grid', type=int, default=2, help='images per canvas side')
    compose.add_argument('--threshold', type=int, default=32, help='foreground: pixels brighter than this (0-255)')
    compose.add_argument('--train-canvases', type=int, default=2000)
    compose.add_argument('--eval-canvases', type=int, default=500)
    compose.add_argument('--seed', type=int, default=0)
    compose.add_argument('--depth', action='store_true',
                         help='add a depth column: background 1.0, a foreground pixel of class c in row r of its '
                              '(h-row) tile (1 + c + 0.5 r / (h - 1)) / (num_classes + 1)')
    return p.parse_args(argv)


def _without_per_class_iou(result):
    """The printed result: per-class IoU lists only in the results file."""
    if isinstance(result, list):
        return [_without_per_class_iou(r) for r in result]
    if isinstance(result, dict):
        return {k: _without_per_class_iou(v) for k, v in result.items() if k != 'per_class_iou'}
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        result = run_probe(args)
    except (DatasetError, CheckpointError, ProbeError, DestinationError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    result['wall_time_s'] = time.perf_counter() - start
    print(json.dumps(_without_per_class_iou(result), indent=2))
    if getattr(args, 'results_file', None):
        write_results_file(args.results_file, result)
    return 0


if __name__ == '__main__':
    sys.exit(main())
