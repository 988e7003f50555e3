"""Models from a registered name (maybe pretrained, from the Hub) or a checkpoint of any kind."""
import difflib
import json
import os
from typing import List, Optional, Sequence

import torch
from torch import nn

from timm_recursive.models._hub import go_offline_if_hub_unreachable
from timm_recursive.models._pretrained import PretrainedWeightsError, load_error

from .checkpoint import CheckpointError, load_weights

__all__ = ['create_classifier', 'create_model_from_checkpoint', 'create_model_from_run_args', 'check_input_size',
           'check_fits_dataset', 'check_model_name', 'model_arguments']


# the errors of a model's own checks of its arguments (an unknown one, one out of range, timm's asserts)
ARGUMENT_ERRORS = (TypeError, ValueError, AssertionError)


def _create_model(model_name: str, argument_errors=ARGUMENT_ERRORS, shown_as: Optional[str] = None,
                  **kwargs) -> nn.Module:
    """``timm.create_model``, an argument the architecture refuses (unknown, out of range: ``argument_errors``) a
    ``CheckpointError`` naming the model (``shown_as``, default ``model_name``) and the options that set them."""
    import timm
    try:
        return timm.create_model(model_name, **kwargs)
    except OSError:  # weights that cannot be fetched or read (some are ValueErrors too): the callers report those
        raise
    except argument_errors as e:
        raise CheckpointError(f'cannot build {shown_as or model_name}: {type(e).__name__}: {e} '
                              f'(check --model-kwargs and the options that set model arguments)') from e


def model_arguments(options) -> dict:
    """The keyword arguments the commands' model options give (``options``: ``model_kwargs``, the parsed
    ``--model-kwargs``, and ``in_chans``, ``--in-chans``, when given)."""
    in_chans = getattr(options, 'in_chans', None)
    return {**options.model_kwargs, **({'in_chans': in_chans} if in_chans is not None else {})}


def create_model_from_checkpoint(checkpoint: str, model_name: Optional[str] = None, **kwargs) -> nn.Module:
    """A timm model from an exported folder, a training run or state folder, or a weights file.

    * folder with ``config.json`` + weights (``export_model`` / Hub layout): ``local-dir:`` loading;
    * training run folder: its ``model/`` export;
    * training state folder (``checkpoints/epochN``) or a weights file: ``model_name`` (or the run's
      ``args.json`` two levels up) gives the architecture, then the weights load strictly.
    """
    if not os.path.exists(checkpoint):
        raise CheckpointError(f'checkpoint {checkpoint} does not exist')
    if os.path.isdir(checkpoint) and os.path.isfile(os.path.join(checkpoint, 'model', 'config.json')):
        checkpoint = os.path.join(checkpoint, 'model')
    if os.path.isdir(checkpoint) and os.path.isfile(os.path.join(checkpoint, 'config.json')):
        try:
            # a keyword the architecture refuses is reported as for a model built by name; a ValueError here is
            # the folder's (its config.json, its weights)
            return _create_model(f'local-dir:{os.path.abspath(checkpoint)}', (TypeError, AssertionError),
                                 shown_as=f'the model of {checkpoint}', pretrained=True, **kwargs)
        except CheckpointError:
            raise
        except (RuntimeError, OSError, ValueError) as e:
            raise CheckpointError(f'cannot load exported model {checkpoint}: {load_error(e, checkpoint)}') from None
    weights = checkpoint
    if os.path.isdir(checkpoint):
        weights = os.path.join(checkpoint, 'model.safetensors')
        run_args = os.path.join(checkpoint, os.pardir, os.pardir, 'args.json')
        if model_name is None and os.path.isfile(run_args):
            with open(run_args) as f:
                return load_weights(create_model_from_run_args(json.load(f), **kwargs), weights)
    if model_name is None:
        raise CheckpointError(f'{checkpoint} does not say which architecture it holds: pass the model name')
    return load_weights(_create_model(model_name, **kwargs), weights)


def create_model_from_run_args(recorded: dict, **kwargs) -> nn.Module:
    """The architecture a training run's ``args.json`` (``recorded``) names, its arguments, classes and channels
    as trained, without weights (``kwargs`` add to them)."""
    kwargs = {**recorded.get('model_kwargs', {}), 'num_classes': recorded['num_classes'],
              'in_chans': recorded['in_chans'], **kwargs}
    return _create_model(recorded['model'], **kwargs)


def check_model_name(model_name: str) -> None:
    """A ``CheckpointError`` for a name timm cannot build: an unknown architecture (with the closest names), or a
    pretrained tag the architecture does not have (with its tags). ``hf-hub:`` and ``local-dir:`` names pass."""
    import timm
    if model_name.startswith(('hf-hub:', 'local-dir:')):
        return
    arch, _, tag = model_name.partition('.')
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=3)
        hint = f'did you mean {", ".join(close)}?' if close else 'see timm.list_models()'
        raise CheckpointError(f'unknown model {model_name!r} ({hint})')
    tags = [name.partition('.')[2] for name in timm.models.get_arch_pretrained_cfgs(arch)]
    if tag and tag not in tags:
        raise CheckpointError(f'{arch} has no pretrained tag {tag!r}; its tags: {", ".join(tags) or "none"}')


def create_classifier(model_name: str, num_classes: int, pretrained: bool = False, in_chans: Optional[int] = None,
                      **kwargs) -> nn.Module:
    """``timm.create_model`` for a classification dataset, with clear errors.

    ``in_chans`` defaults to the pretrained config's channels (1 for the ``.mnist`` /
    ``.fashion_mnist`` tags). An unknown name, or pretrained weights that cannot be fetched (offline,
    missing on the Hub) or loaded, raise ``CheckpointError`` naming the model and the cause.
    """
    import timm
    check_model_name(model_name)
    cfg = timm.models.get_pretrained_cfg(model_name)
    if in_chans is None:
        in_chans = cfg.input_size[0] if cfg is not None and cfg.input_size else 3
    if pretrained and (model_name.startswith('hf-hub:') or getattr(cfg, 'hf_hub_id', None)) and not kwargs.get(
            'pretrained_cfg_overlay', {}).get('file'):
        go_offline_if_hub_unreachable()
    try:
        return _create_model(model_name, pretrained=pretrained, num_classes=num_classes, in_chans=in_chans, **kwargs)
    except PretrainedWeightsError as e:  # this package's models say it in one sentence already
        raise CheckpointError(str(e)) from None
    except (OSError, RuntimeError) as e:  # hub errors are OSErrors; mismatched weights RuntimeErrors
        if not pretrained:
            raise
        source = (kwargs.get('pretrained_cfg_overlay', {}).get('file') or getattr(cfg, 'hf_hub_id', None)
                  or getattr(cfg, 'url', None) or model_name)
        raise CheckpointError(f'cannot load the pretrained weights of {model_name} from {source}: '
                              f'{load_error(e, source)}') from None


def check_input_size(model: nn.Module, input_size: Sequence[int]) -> None:
    """Run one image of ``input_size`` (C, H, W) through ``model`` (eval mode, no gradient), so that an input
    the architecture cannot take (too small for its downsampling, not a multiple of its patch) is a
    ``CheckpointError`` naming the size before a run writes anything, not a failure after data loading."""
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, *input_size))
    except (RuntimeError, ValueError, AssertionError) as e:
        size = 'x'.join(str(s) for s in input_size)
        raise CheckpointError(f'{model.pretrained_cfg.get("architecture", type(model).__name__)} cannot take '
                              f'{size} input: {str(e).splitlines()[0]}') from e
    finally:
        model.train(was_training)


def _names(names: Sequence[str], shown: int = 4) -> str:
    """A class list in a few words: its first names and how many there are."""
    head = ', '.join(repr(n) for n in list(names)[:shown])
    return f'{len(names)} classes ({head}{", ..." if len(names) > shown else ""})'


def check_fits_dataset(model: nn.Module, splits) -> List[str]:
    """Check ``model`` against a dataset's ``splits`` before it is evaluated on them: a ``CheckpointError`` naming
    both sides when it predicts another number of classes, or was trained on classes of other names (its export
    records them as ``label_names``); the warnings (one line each) of images that will be converted to its
    channels (grayscale to RGB or back), which runs but may be a dataset the model was not made for."""
    from timm_recursive.data import image_mode, is_grayscale, resolve_model_data_config
    if model.num_classes != splits.num_classes:
        raise CheckpointError(f'the model predicts {model.num_classes} classes, the dataset has {splits.num_classes}')
    trained_on = getattr(model, 'pretrained_cfg', {}).get('label_names')
    if trained_on and splits.class_names and list(trained_on) != list(splits.class_names):
        raise CheckpointError(f'the model was trained on {_names(trained_on)}, the dataset has '
                              f'{_names(splits.class_names)}: evaluate it on the dataset it was trained on')
    takes_gray = image_mode(resolve_model_data_config(model)) == 'L'
    if len(splits.eval) == 0 or is_grayscale(splits.eval[0][splits.image_column]) == takes_gray:
        return []
    takes, has = ('grayscale', 'colour') if takes_gray else ('RGB', 'grayscale')
    return [f'the model takes {takes} images and the dataset\'s are {has}: they are converted to {takes} '
            f'(--in-chans sets the channels a model is built for)']
