"""Export a training run as a Hugging Face Hub model folder (weights, config, model card) and upload it.

    timm-recursive-push-to-hub runs/digits --repo-id me/recursive-digits --dry-run
    timm-recursive-push-to-hub runs/fm_dsa_moe --repo-id me/fm-dsa-moe --weights last
    timm-recursive-push-to-hub runs/dino_fm/model --repo-id me/dino-fm   (a run's model/ folder: that run)

``--dry-run`` writes the folder only (default ``<run>/hub``). Otherwise the folder is uploaded with
``huggingface_hub`` to ``--repo-id`` (created if needed; token from ``--token``, ``HF_TOKEN`` or
``huggingface-cli login``). ``--weights best`` publishes the run's exported best epoch,
``--weights last`` its last epoch (no model selection at all); the card reports the figures the run
measured for those weights. A ``timm-recursive-train-dino`` run publishes its teacher backbone (the
last epoch's) with a backbone card.
"""
import os
import sys

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.cli.args import CommandParser, HelpFormatter, hub_repo_id
from timm_recursive.hub import HUB_ORG, HubError, export_run, push_to_hub
from timm_recursive.runs import OUTPUT_MARKER, RunRecordError, run_folder


def main(argv=None) -> int:
    p = CommandParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter)
    p.add_argument('run', help='run folder of timm-recursive-train or -train-dino, or its exported model/ folder')
    p.add_argument('--repo-id', type=hub_repo_id, default=None,
                   help=f'Hub model repo, e.g. user/name (needed to upload; the card of a --dry-run names '
                        f'{HUB_ORG}/<arch>.<run> without it)')
    p.add_argument('--out', default=None, help='export folder (default: <run>/hub)')
    p.add_argument('--weights', choices=('best', 'last'), default=None,
                   help='default: best (a DINO run: last, its exported teacher)')
    p.add_argument('--include-pickle', action='store_true', help='also write pytorch_model.bin (pickle)')
    p.add_argument('--dry-run', action='store_true', help='write the folder, do not upload')
    p.add_argument('--private', action='store_true')
    p.add_argument('--token', default=None)
    p.add_argument('--revision', default=None, help='branch to upload to')
    args = p.parse_args(argv)
    if not args.repo_id and not args.dry_run:
        p.error('--repo-id is needed to upload (or pass --dry-run to write the folder only)')
    try:
        out = args.out or os.path.join(run_folder(args.run), 'hub')
        if args.out is None and os.path.isdir(out):
            # the run's own hub/ folder: an export of this command, from before it marked its folders
            open(os.path.join(out, OUTPUT_MARKER), 'w').close()
        export_run(args.run, out, repo_id=args.repo_id, weights=args.weights, include_pickle=args.include_pickle)
        print(f'wrote {out}: ' + ', '.join(sorted(name for name in os.listdir(out) if name != OUTPUT_MARKER)))
        if args.dry_run:
            return 0
        url = push_to_hub(out, args.repo_id, token=args.token, private=args.private, revision=args.revision)
        print(f'uploaded to {url}')
    except (HubError, RunRecordError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
