"""The probes of ``timm-recursive-probe`` from its parsed options: the frozen backbone, its features extracted once
per split and cached, the probe heads trained on them (``timm_recursive.analysis.probing``), and the segmentation
canvases of ``probe compose``. ``run_probe(args)`` runs the one its ``args.command`` names."""
import os
import shutil
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

from timm_recursive.data import (
    DatasetError,
    collate_classification,
    create_dataset_transform,
    image_mode,
    resolve_dataset,
    resolve_dataset_from_options,
    resolve_depth_dataset,
    resolve_model_data_config,
    resolve_segmentation_dataset,
    to_depth_array,
    to_mask_array,
    to_pil,
)
from timm_recursive.runs import create_classifier, create_model_from_checkpoint, model_arguments
from timm_recursive.runs.checkpoint import CheckpointError
from timm_recursive.runs.files import (
    check_destination,
    check_file_destination,
    replace_output_dir,
    temp_path_beside,
    write_json_atomic,
)

from .probing import (
    canvas_depths,
    check_backbone,
    check_blocks,
    classification_features,
    classification_features_per_block,
    compose_canvases,
    dense_features,
    dense_probe,
    depth_probe,
    extract_features,
    linear_probe,
    valid_depth,
)

__all__ = ['ProbeError', 'run_probe', 'create_backbone', 'check_probe', 'dense_transform', 'collate_dense']


def run_probe(args) -> dict:
    """The probe (``linear``, ``segment``, ``depth``) or the canvases (``compose``) ``args.command`` names, its result
    as a dict. Destinations are checked before anything runs: nothing of the user's is replaced."""
    if args.command == 'compose':
        check_destination(args.out)
        return run_compose(args)
    if args.results_file:  # a destination that cannot be written fails now, not after the probe
        check_file_destination(args.results_file, '--results-file')
    torch.manual_seed(args.seed)
    model = create_backbone(args)
    check_probe(args, model)
    result = {'linear': run_linear, 'segment': run_segment, 'depth': run_depth}[args.command](args, model)
    return {'probe': args.command, 'checkpoint': args.checkpoint, 'model': args.model,
            'architecture': model.pretrained_cfg.get('architecture'), 'dataset': args.dataset, **result}


def create_backbone(args):
    """The frozen backbone (``num_classes=0``) named by ``--checkpoint`` or ``--model`` (``--in-chans`` among its
    arguments when given)."""
    kwargs = model_arguments(args)
    if args.checkpoint:
        model = create_model_from_checkpoint(args.checkpoint, args.model, num_classes=0, **kwargs)
    elif args.model:
        model = create_classifier(args.model, 0, pretrained=args.pretrained, **kwargs)
    else:
        raise CheckpointError('name the backbone with --checkpoint or --model')
    return model.eval().requires_grad_(False)


def _limit(dataset, n):
    return dataset.select(range(min(n, len(dataset)))) if n else dataset


def _fit_kwargs(args) -> dict:
    return dict(epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay, batch_size=args.probe_batch_size,
                seed=args.seed, progress=not args.no_progress)


class ProbeError(ValueError):
    """Probe options that do not fit the backbone or each other."""


def _blocks(model, layers):
    """``--layers`` as block indices of ``model`` (None: the default readout of each probe)."""
    if layers is None:
        return None
    try:
        return check_blocks(model, layers)
    except ValueError as e:
        raise ProbeError(f'--layers: {e}') from None


def _probe_per_block(blocks, cached: dict, fit) -> dict:
    """``fit(train, eval)`` on cached features of one readout (``blocks`` None: features (N, ...)) or one per
    block (features (N, len(blocks), ...)): then every block's result under ``per_layer``, the last one's on top."""
    if blocks is None:
        return fit(cached['train'], cached['eval'])
    (train_x, train_y), (eval_x, eval_y) = cached['train'], cached['eval']
    # every block's probe head starts from the same random state: the one a single probe would start from
    start = torch.get_rng_state()
    per_layer = []
    for i, block in enumerate(blocks):
        torch.set_rng_state(start)
        per_layer.append({'block': block, **fit((train_x[:, i], train_y), (eval_x[:, i], eval_y))})
    return {**per_layer[-1], 'per_layer': per_layer}


def check_probe(args, model) -> None:
    """The checks of ``--checkpoint``/``--model`` and the options against the backbone that need no data: a model
    that is not a ViT, ``--n-last-blocks`` or ``--layers`` beyond its blocks (``ProbeError``)."""
    try:
        check_backbone(model, needs_cls=args.command == 'linear' or args.with_cls)
    except ValueError as e:
        raise ProbeError(str(e)) from None
    _blocks(model, args.layers)
    if args.command == 'linear':
        if args.layers and args.n_last_blocks != 1:
            raise ProbeError('--layers probes one block at a time: it cannot be combined with --n-last-blocks')
        if args.n_last_blocks > len(model.blocks):
            raise ProbeError(f'--n-last-blocks {args.n_last_blocks}: the backbone has {len(model.blocks)} blocks')


def run_linear(args, model) -> dict:
    blocks = _blocks(model, args.layers)
    splits = resolve_dataset_from_options(args)
    transform = create_dataset_transform(model, splits, is_training=False)

    def features(x):
        if blocks is None:
            return classification_features(model, x, args.n_last_blocks, args.avgpool_patches)
        return classification_features_per_block(model, x, blocks, args.avgpool_patches)

    cached = {}
    for name, split, limit in (('train', splits.train, args.max_train_samples),
                               ('eval', splits.eval, args.max_eval_samples)):
        loader = DataLoader(_limit(split, limit).with_transform(transform), batch_size=args.batch_size,
                            collate_fn=collate_classification, num_workers=args.workers)
        cached[name] = extract_features(features, loader, 'label', progress=not args.no_progress, desc=name)
    result = _probe_per_block(blocks, cached, lambda train, evaluation: linear_probe(
        *train, *evaluation, splits.num_classes, **_fit_kwargs(args)))
    return {**result, 'n_last_blocks': args.n_last_blocks, 'avgpool_patches': args.avgpool_patches,
            'dataset_source': splits.source}


def dense_transform(config: dict, img_size: int, image_column: str, target_column: str,
                    read_target: Callable[[object], np.ndarray], target_dtype):
    """``with_transform`` function: image resized to ``img_size`` and normalised; the per-pixel target
    (``read_target`` of a row's value, a 2-D array) resized with nearest (labels stay labels, a missing depth
    stays 0) and given as ``target`` of ``target_dtype``."""
    from PIL import Image
    from timm.data.transforms import str_to_interp_mode
    from torchvision import transforms as T

    image_tf = T.Compose([T.Resize((img_size, img_size), interpolation=str_to_interp_mode(config['interpolation'])),
                          T.ToTensor(), T.Normalize(config['mean'], config['std'])])
    mode = image_mode(config)

    def apply(batch):
        targets = [Image.fromarray(read_target(t)).resize((img_size, img_size), Image.NEAREST)
                   for t in batch[target_column]]
        return {'pixel_values': [image_tf(to_pil(img, mode)) for img in batch[image_column]],
                'target': [torch.from_numpy(np.array(t, dtype=target_dtype)) for t in targets]}

    return apply


def collate_dense(batch):
    return {'pixel_values': torch.stack([b['pixel_values'] for b in batch]),
            'target': torch.stack([b['target'] for b in batch])}


def cache_dense_features(args, model, splits, target_column: str, read_target, target_dtype):
    """``({'train': (features, targets), 'eval': ...}, blocks, img_size)``: the patch features of ``--layers``
    (or the last block) of both splits at ``--img-size``, and their per-pixel targets (``dense_transform``)."""
    blocks = _blocks(model, args.layers)
    config = resolve_model_data_config(model)
    img_size = args.img_size or config['input_size'][-1]
    patch = model.patch_embed.patch_size
    if img_size % patch[0] or img_size % patch[1]:
        raise DatasetError(f'--img-size {img_size} is not a multiple of the patch size {tuple(patch)}')
    if img_size != config['input_size'][-1] and not getattr(model, 'dynamic_img_size', False):
        model.set_input_size(img_size=(img_size, img_size))  # interpolates the position embedding
    transform = dense_transform(config, img_size, splits.image_column, target_column, read_target, target_dtype)

    def features(x):
        if blocks is None:
            return dense_features(model, x, with_cls=args.with_cls)[:, 0]
        return dense_features(model, x, with_cls=args.with_cls, blocks=blocks)

    cached = {}
    for name, split, limit in (('train', splits.train, args.max_train_samples),
                               ('eval', splits.eval, args.max_eval_samples)):
        loader = DataLoader(_limit(split, limit).with_transform(transform), batch_size=args.batch_size,
                            collate_fn=collate_dense, num_workers=args.workers)
        # half precision halves the memory of the cached patch grids; the probe computes in fp32
        cached[name] = extract_features(features, loader, 'target', dtype=torch.float16, progress=not args.no_progress,
                                        desc=name)
    return cached, blocks, img_size


def run_segment(args, model) -> dict:
    splits = resolve_segmentation_dataset(args.dataset, image_column=args.image_column, mask_column=args.mask_column,
                                          train_split=args.train_split, eval_split=args.eval_split,
                                          data_dir=args.data_dir)
    cached, blocks, img_size = cache_dense_features(
        args, model, splits, splits.mask_column, lambda m: to_mask_array(m).astype(np.int32), np.int64)
    if args.reduce_zero_label:
        cached = {name: (feats, torch.where((masks == 0) | (masks == args.ignore_index), args.ignore_index, masks - 1))
                  for name, (feats, masks) in cached.items()}
    labels = torch.cat([m[m != args.ignore_index] for _, m in cached.values()])
    num_classes = args.num_classes or int(labels.max()) + 1
    result = _probe_per_block(blocks, cached, lambda train, evaluation: dense_probe(
        *train, *evaluation, num_classes, ignore_index=args.ignore_index, **_fit_kwargs(args)))
    return {**result, 'num_classes': num_classes, 'img_size': img_size, 'with_cls': args.with_cls,
            'dataset_source': splits.source}


def run_depth(args, model) -> dict:
    splits = resolve_depth_dataset(args.dataset, image_column=args.image_column, depth_column=args.depth_column,
                                   train_split=args.train_split, eval_split=args.eval_split, data_dir=args.data_dir)
    cached, blocks, img_size = cache_dense_features(
        args, model, splits, splits.depth_column, lambda d: to_depth_array(d, args.depth_scale), np.float32)
    valid = 'depth > 0' + (f' and <= --max-depth {args.max_depth}' if args.max_depth is not None else '')
    for name, (_, depths) in cached.items():
        if not valid_depth(depths, args.max_depth).any():
            raise DatasetError(f'the {name} split has no valid depth pixel ({valid}, after --depth-scale '
                               f'{args.depth_scale})')
    result = _probe_per_block(blocks, cached, lambda train, evaluation: depth_probe(
        *train, *evaluation, max_depth=args.max_depth, **_fit_kwargs(args)))
    return {**result, 'img_size': img_size, 'with_cls': args.with_cls, 'depth_scale': args.depth_scale,
            'max_depth': args.max_depth, 'dataset_source': splits.source}


def run_compose(args) -> dict:
    import datasets
    splits = resolve_dataset(args.dataset)
    out, written = {}, {}
    for name, split, count, seed in (('train', splits.train, args.train_canvases, args.seed),
                                     ('test', splits.eval, args.eval_canvases, args.seed + 1)):
        as_arrays = split.with_format('numpy')
        images = as_arrays[splits.image_column]
        if not (isinstance(images, np.ndarray) and images.ndim == 3 and images.dtype == np.uint8):
            # encoded or colour images: decode one by one (an array column is read at once above)
            images = np.stack([np.asarray(to_pil(img, 'L')) for img in split[splits.image_column]])
        labels = np.asarray(as_arrays[splits.label_column])
        canvases, masks = compose_canvases(images, labels, count, grid=args.grid, threshold=args.threshold, seed=seed)
        columns = {'image': canvases, 'mask': masks}
        if args.depth:
            columns['depth'] = canvas_depths(masks, splits.num_classes, tile_height=images.shape[1])
        features = datasets.Features({column: datasets.Array2D(shape=values.shape[1:], dtype=str(values.dtype))
                                      for column, values in columns.items()})
        out[name] = datasets.Dataset.from_dict(columns, features=features)
        written[name] = count
    tmp = temp_path_beside(args.out)  # OUT.tmp may be the user's: never written, never removed
    try:
        datasets.DatasetDict(out).save_to_disk(tmp)
        names = splits.class_names or [str(i) for i in range(splits.num_classes)]
        write_json_atomic(os.path.join(tmp, 'classes.json'), {'labels': ['background', *names], 'ignore_index': None})
        replace_output_dir(tmp, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    return {'out': args.out, 'canvases': written, 'canvas_size': list(canvases.shape[1:]), 'grid': args.grid,
            'threshold': args.threshold, 'num_classes': len(names) + 1, 'depth': args.depth, 'source': splits.source}
