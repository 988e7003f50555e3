"""The commands: every console script and ``timm-recursive <command>`` tool of the package, and the option
groups they share (``args``).

``timm-recursive <command> [options]`` runs one of ``COMMANDS`` (``python -m timm_recursive.cli`` is the same);
the training, evaluation, publishing and probing commands are also installed under their own names
(``timm-recursive-train``, ...). Each command is a module here with a ``main(argv) -> int``; what it computes
lives in the layers beneath (``train``, ``analysis``, ``hub``, ``runs``, ``data``), never here.
"""
import importlib
import sys
from typing import List, Optional

__all__ = ['COMMANDS', 'main']

# command -> (module of timm_recursive.cli, one line of help)
COMMANDS = {
    'train': ('train', 'train any timm model (recursive classifiers, entmax ViTs, token fusion DeiTs) with Accelerate'),
    'evaluate': ('evaluate', 'top-1/top-5 of a checkpoint or pretrained model at every recursion step'),
    'push-to-hub': ('push_to_hub', 'export a training run as a Hub folder with its model card, and upload it'),
    'train-dino': ('train_dino', 'DINO self-supervised pretraining of a ViT'),
    'probe': ('probe', 'linear classification, segmentation and depth probes of a frozen backbone'),
    'report': ('report', 'what a recursive classifier does step by step: plots and a markdown report'),
    'efficiency': ('efficiency', 'parameters, multiply-adds and attention sparsity of recursive classifiers'),
    'adaptive-halting': ('adaptive_halting', 'accuracy, steps and cost of adaptive halting per threshold'),
    'attention-maps': ('attention_maps', 'entmax attention sparsity and PCA feature maps of a ViT'),
    'point-in-box': ('point_in_box', 'how much of each patch\'s attention stays inside its object\'s box, per block'),
    'recursion-gradients': ('recursion_gradients', 'gradient reaching each latent of the history, per window'),
    'recursion-interventions': ('recursion_interventions', 'replace a step\'s input tokens: does its answer follow?'),
    'summary-probe': ('summary_probe', 'linear probes of the summary token against the recursion\'s steps'),
    'token-fusion-cost': ('token_fusion_cost', 'the keep rate of a token fusion model at a multiply-add budget'),
    'token-fusion-maps': ('token_fusion_maps', 'which patches a token fusion ViT keeps and fuses, as PNG maps'),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ['usage: timm-recursive <command> [options]   (timm-recursive <command> --help for its options)', '',
             'commands:']
    lines += [f'  {name:<{width}}  {about}' for name, (_, about) in COMMANDS.items()]
    return '\n'.join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help'):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f'{_usage()}\n\nerror: unknown command {name!r}', file=sys.stderr)
        return 2
    command = importlib.import_module(f'{__name__}.{COMMANDS[name][0]}')
    sys.argv[0] = f'timm-recursive {name}'  # argparse names the command in its usage and errors
    return command.main(rest)
