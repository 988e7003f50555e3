"""The option groups and argument types the commands share: a model (``add_model_arguments``), a run folder
(``add_run_arguments``), a dataset (``add_data_arguments``), YAML option files (``parse_args_with_config``) and
the ``argparse`` types that refuse an out-of-range number with a usage error."""
import argparse
import copy
import sys
from typing import Optional

from timm.utils import ParseKwargs
from torch import nn

from timm_recursive.data import DatasetSplits
from timm_recursive.runs import (
    check_fits_dataset,
    create_classifier,
    create_model_from_checkpoint,
    model_arguments,
)

__all__ = [
    'CommandParser', 'ModelKwargs', 'add_model_arguments', 'model_from_arguments', 'add_run_arguments',
    'parse_args_with_config', 'add_data_arguments',
    'positive_int', 'non_negative_int', 'non_negative_float', 'positive_float', 'unit_interval',
    'unit_interval_or_zero', 'hub_repo_id', 'torch_device', 'add_device_argument', 'HelpFormatter', 'default_dataset',
    'halting_threshold', 'add_halting_arguments',
]


class CommandParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one ``error:`` line and a hint to ``--help``, not the usage block
    before it (a command's usage runs to dozens of lines); ``--help`` prints the usage as always. Abbreviated
    option names are refused (``allow_abbrev=False``): a prefix is an error, never silently another option."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault('allow_abbrev', False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f'{self.prog}: error: {message}\n(run {self.prog} --help for its options)\n')


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``ArgumentDefaultsHelpFormatter`` that says each option's default once: not after a help text
    that states its default itself (``default: the model's``), nor for an option that is off or unset by default
    (``None``, ``False``, empty), where ``(default: None)`` would say nothing; an option without a help text
    shows its default alone (``default: 20``), where argparse shows nothing."""

    @staticmethod
    def _says_nothing(default) -> bool:
        return (default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (str, list, tuple, dict)) and not default))

    def _format_action(self, action):
        if action.help is None and action.option_strings and not self._says_nothing(action.default):
            action = copy.copy(action)
            action.help = 'default: %(default)s'
        return super()._format_action(action)

    def _get_help_string(self, action):
        text = action.help or ''
        if 'default' in text or self._says_nothing(action.default):
            return text
        return super()._get_help_string(action)


def _at_least(text: str, kind: type, low):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not {"an integer" if kind is int else "a number"}') from None
    if not value >= low:  # also refuses nan
        raise argparse.ArgumentTypeError(f'must be at least {low:g}, got {text}')
    return value


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1 (a batch size, an image size, a count of epochs)."""
    return _at_least(text, int, 1)


def non_negative_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 0 (data loader workers)."""
    return _at_least(text, int, 0)


def non_negative_float(text: str) -> float:
    """An ``argparse`` type: a number of at least 0 (a learning rate, a weight decay, a loss weight)."""
    return _at_least(text, float, 0.)


def positive_float(text: str) -> float:
    """An ``argparse`` type: a number above 0 (a scale to divide by, a maximum depth)."""
    value = _at_least(text, float, 0.)
    if value == 0.:
        raise argparse.ArgumentTypeError(f'must be above 0, got {text}')
    return value


def unit_interval(text: str) -> float:
    """An ``argparse`` type: a number in (0, 1] (a probability that must leave room to act)."""
    value = _at_least(text, float, 0.)
    if not 0. < value <= 1.:
        raise argparse.ArgumentTypeError(f'must be in (0, 1], got {text}')
    return value


def unit_interval_or_zero(text: str) -> float:
    """An ``argparse`` type: a probability in [0, 1]."""
    value = _at_least(text, float, 0.)
    if value > 1.:
        raise argparse.ArgumentTypeError(f'must be in [0, 1], got {text}')
    return value


def torch_device(text: str) -> str:
    """An ``argparse`` type: a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``), so that
    asking for a missing GPU is a usage error before any data or model loads, not torch's error after."""
    import torch
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None
    if device.type == 'cuda':
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f'{text}: no CUDA GPU is available here (torch.cuda.is_available() is '
                                             'False); use --device cpu')
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f'{text}: this machine has {count} CUDA GPU(s), 0..{count - 1}')
    elif device.type == 'mps' and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f'{text}: the MPS backend is not available here; use --device cpu')
    return text


def add_device_argument(parser) -> None:
    """``--device``: where the model runs (default: the first CUDA GPU when there is one, else the CPU)."""
    import torch
    parser.add_argument('--device', type=torch_device, default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='torch device, e.g. cpu, cuda, cuda:1')


def hub_repo_id(text: str) -> str:
    """An ``argparse`` type: a Hugging Face Hub repo id (``name`` or ``namespace/name``), checked with
    huggingface_hub's own ``validate_repo_id``, so a bad one is a usage error before anything is written."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    try:
        validate_repo_id(text)
    except HFValidationError as e:
        # its advice about repo_type concerns its Python callers, not this option
        raise argparse.ArgumentTypeError(str(e).replace(' Use `repo_type` argument if needed.', '')) from None
    return text


def parse_args_with_config(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """timm's two-stage parse: ``-c/--config FILE``, a YAML mapping of option names (``batch-size`` or
    ``batch_size``) to values, sets ``parser``'s defaults, then the command line is parsed over them (it wins).

    Each value goes through its option's type and choices, so a bad one is a usage error naming the file.
    """
    import yaml
    config_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    config_parser.add_argument('-c', '--config', default=None)
    path = config_parser.parse_known_args(argv)[0].config
    if path is None:
        return parser.parse_args(argv)
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        parser.error(f'--config {path}: {e}'.splitlines()[0])
    if not isinstance(values, dict):
        parser.error(f'--config {path}: expected a mapping of option names to values')
    # an option by its dest or any of its names (seed for --seeds/--seed, b for -b/--batch-size)
    actions = {name.lstrip('-').replace('-', '_'): action for action in parser._actions
               for name in (action.dest, *action.option_strings) if action.dest not in ('help', 'config')}
    defaults = {}
    for key, value in values.items():
        action = actions.get(str(key).lstrip('-').replace('-', '_'))
        if action is None:
            parser.error(f'--config {path}: unknown option {key!r}')
        if isinstance(action.default, dict) and not isinstance(value, dict):
            parser.error(f'--config {path}: {key}: expected a mapping (e.g. {{num_steps: 8}}), got {value!r}')
        if isinstance(action.default, dict) or action.nargs == 0:  # --model-kwargs mapping, on/off flags
            defaults[action.dest] = value
            continue
        items = value if isinstance(value, list) else [value]
        checked = []
        for item in items:
            try:
                checked.append(action.type(str(item)) if action.type is not None else item)
            except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
                parser.error(f'--config {path}: {key}: {e}')
            if action.choices is not None and checked[-1] not in action.choices:
                parser.error(f'--config {path}: {key}: {item!r} is not one of {", ".join(map(str, action.choices))}')
        if isinstance(action.nargs, int) and len(checked) != action.nargs:
            parser.error(f'--config {path}: {key}: expected {action.nargs} values, got {value!r}')
        defaults[action.dest] = checked if action.nargs not in (None, '?') else checked[0]
    parser.set_defaults(**defaults)
    return parser.parse_args(argv)


def add_run_arguments(group, default_output: str) -> None:
    """The run-folder options every trainer shares: ``-c/--config``, ``--output``, ``--resume``, ``--keep-states``,
    ``--no-progress`` (parse with ``parse_args_with_config``)."""
    group.add_argument('-c', '--config', default=None, metavar='FILE',
                       help='YAML file of option defaults (e.g. batch-size: 64); the command line wins')
    group.add_argument('--output', default=default_output,
                       help='run folder; when it holds a previous run (and no --resume), the next free '
                            'OUTPUT-1, OUTPUT-2, ... is used instead')
    group.add_argument('--resume', nargs='?', const='auto', default=None,
                       help='continue from the newest state in the run folder, or from the given state folder')
    group.add_argument('--keep-states', '--checkpoint-hist', dest='keep_states', type=positive_int, default=2,
                       help='training states of this run kept in checkpoints/ (at least 1)')
    group.add_argument('--no-progress', action='store_true', help='no progress bars')


class ModelKwargs(ParseKwargs):
    """timm's ``ParseKwargs`` (``key=value`` words, values read as Python literals) that refuses a word
    that is not one ``key=value`` pair with a usage error, rather than a traceback."""

    def __call__(self, parser, namespace, values, option_string=None):
        for word in values:
            key, sep, value = word.partition('=')
            if not key or not sep or '=' in value:
                raise argparse.ArgumentError(self, f'expected key=value words, got {word!r}')
        super().__call__(parser, namespace, values, option_string)


def add_model_arguments(parser) -> None:
    """The command-line arguments that choose a model to evaluate or inspect (see ``model_from_arguments``)."""
    parser.add_argument('--model', default=None,
                        help='registered model name (with --pretrained, or for a weights file)')
    parser.add_argument('--pretrained', action='store_true')
    parser.add_argument('--checkpoint', default=None, help='exported folder, run folder, state folder or weights file')
    parser.add_argument('--in-chans', type=positive_int, default=None,
                        help='input channels (default: the checkpoint\'s or the pretrained config\'s)')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs)


def model_from_arguments(args, splits: DatasetSplits) -> nn.Module:
    """The model ``add_model_arguments``'s arguments name (a checkpoint, or a registered, maybe pretrained,
    model), checked against the dataset's ``splits`` (``check_fits_dataset``: its classes, its images' channels).
    Each warning is one ``warning:`` line: random weights (a registered model without ``--pretrained``), images
    converted to the model's channels."""
    if args.checkpoint:
        model = create_model_from_checkpoint(args.checkpoint, args.model, **model_arguments(args))
    else:
        model = create_classifier(args.model, splits.num_classes, pretrained=args.pretrained, **model_arguments(args))
        if not args.pretrained:
            print(f'warning: {args.model} without --pretrained or --checkpoint has random weights', file=sys.stderr)
    for warning in check_fits_dataset(model, splits):
        print(f'warning: {warning}', file=sys.stderr)
    return model


DATASET_HELP = ('digits, a Hub id or alias, a local folder, or a timm name: hfds/ID (Hugging Face datasets), '
                'hfids/ID (streamed), torch/NAME (torchvision, in --data-dir)')


def add_data_arguments(parser, default: Optional[str] = 'digits', required: bool = False,
                       dataset_help: str = DATASET_HELP) -> None:
    """The options that name a dataset and its columns and splits (read with
    ``timm_recursive.data.resolve_dataset_from_options``)."""
    parser.add_argument('--dataset', default=None if required else default, required=required, help=dataset_help)
    parser.add_argument('--data-dir', default=None, metavar='DIR',
                        help='timm\'s dataset root: the folder dataset, torch/ files, the hfds/ and hfids/ '
                             'download cache')
    parser.add_argument('--dataset-config', default=None, metavar='NAME', help='Hugging Face dataset config name')
    parser.add_argument('--dataset-download', action='store_true',
                        help='torch/: download into --data-dir when missing; hfids/: download whole instead of '
                             'streaming')
    parser.add_argument('--class-map', default=None, metavar='FILE',
                        help='timm\'s class map (.txt: a class name a line; .pkl: a {name: index} dict): only its '
                             'classes are kept, labelled with its indices')
    parser.add_argument('--image-column', default=None)
    parser.add_argument('--label-column', default=None)
    parser.add_argument('--train-split', default=None)
    parser.add_argument('--eval-split', '--val-split', '--split', dest='eval_split', default=None,
                        help='the split evaluated (default: test, validation, ... whichever the dataset has)')
    parser.add_argument('--eval-fraction', type=unit_interval_or_zero, default=0.1,
                        help='a dataset with a train split only: hold out this fraction of it (stratified, seed 0) '
                             'as the eval split (0: refuse such a dataset); training then holds out its selection '
                             'images (--val-fraction) from the rest'),


def default_dataset(args) -> None:
    """A ``--dataset`` left out (``add_data_arguments(default=None)``) is, as in timm, the folder of ``--data-dir``
    when that is given (the empty name), else ``digits``."""
    if args.dataset is None:
        args.dataset = '' if args.data_dir is not None else 'digits'


def halting_threshold(text: str) -> float:
    """argparse type: a halting threshold in (0, 1]."""
    from timm_recursive.layers.adaptive_halting import check_threshold
    try:
        return check_threshold(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_halting_arguments(parser: argparse.ArgumentParser) -> None:
    """The options with which ``timm-recursive-evaluate`` and ``timm-recursive report`` measure adaptive halting."""
    from timm_recursive.models.recursive_classifier import HALTING_CRITERIA
    g = parser.add_argument_group('adaptive halting', 'recursive models: measure forward_adaptive per threshold '
                                  '(accuracy, steps per image, multiply-adds per image, images/s against 16 '
                                  'fixed steps)')
    g.add_argument('--halting-thresholds', type=halting_threshold, nargs='+', default=None, metavar='T',
                   help='halting thresholds in (0, 1] to measure (default: none)')
    g.add_argument('--halting-criterion', default='confidence', choices=HALTING_CRITERIA,
                   help="forward_adaptive's criterion ('halting' needs a model trained with a halting head)")
    g.add_argument('--halting-timing-images', type=positive_int, default=1000, help='first images timed')
    g.add_argument('--halting-repeats', type=positive_int, default=3, help='interleaved timing repeats (median)')
