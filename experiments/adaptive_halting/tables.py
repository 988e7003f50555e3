"""The adaptive halting study's tables, from results/<criterion>.json (``run.sh`` writes them)."""
import json
import pathlib
from typing import Dict

from timm_recursive.analysis.adaptive_halting import threshold_table
from timm_recursive.analysis.generated_markdown import markdown_table, pct
from timm_recursive.hub.cards import public_command, strip_local_paths

CRITERIA = ('confidence', 'change')


def _matching(result: Dict) -> str:
    full = result['fixed'][-1]
    match = result['matching']
    if match is None:
        return (f"no {result['criterion']} threshold reaches the {pct(full['top1'])}% of {full['steps']} "
                f"fixed steps")
    return (f"{result['criterion']} threshold {match['threshold']:g}: {pct(match['top1'])}% "
            f"(vs {pct(full['top1'])}% at {full['steps']} fixed steps) with {match['mean_steps']:.2f} steps "
            f"on average, {match['macs_ratio']:.3f}x the multiply-adds and {match['speedup']:.2f}x the images/s")


def _histogram(result: Dict) -> str:
    steps = range(1, result['num_steps'] + 1)
    rows = [[f"{result['criterion']} {r['threshold']:g}", *r['step_histogram']] for r in result['thresholds']]
    return markdown_table(['halting', *[str(s) for s in steps]], rows)


def _provenance(result: Dict) -> str:
    return (f"{result['criterion']}: weights after epoch {result['checkpoint_epoch']} of {result['run_epochs']}, "
            f"measured {result['date']}, commit {result['commit'] or 'not recorded'}, {result['machine']}, "
            f"{result['timing']['threads']} threads, {result['wall_s']:.0f} s")


def tables(results: pathlib.Path) -> Dict[str, str]:
    data = {c: json.loads((results / f'{c}.json').read_text()) for c in CRITERIA if (results / f'{c}.json').exists()}
    missing = 'not measured yet: `experiments/adaptive_halting/run.sh OUTPUT_ROOT --save` measures it'
    pieces: Dict[str, str] = {
        f'{c}{suffix}': missing for c in CRITERIA for suffix in ('', '_histogram', '_matching', '_provenance')}
    for criterion, result in data.items():
        pieces[criterion] = threshold_table(result)
        pieces[f'{criterion}_histogram'] = _histogram(result)
        pieces[f'{criterion}_matching'] = _matching(result)
        pieces[f'{criterion}_provenance'] = _provenance(result)
    training = json.loads((results / 'training' / 'summary.json').read_text())
    pieces['training_provenance'] = (
        f"trained {training['epochs']} epochs on {training['train_images']} images in "
        f"{training['wall_time_s'] / 60:.1f} min ({training['hardware']}, {strip_local_paths(training['dataset_source'])}): "
        f"`{public_command(training['command'])}`")
    confidence = data['confidence']
    full, match = confidence['fixed'][-1], confidence['matching']
    if match is None:
        pieces['headline'] = f"no confidence exit reaches the {pct(full['top1'])}% of 16 fixed steps"
    else:
        pieces['headline'] = (
            f"{pct(match['top1'])}% with {match['mean_steps']:.2f} steps per image on average vs "
            f"{pct(full['top1'])}% at {full['steps']} fixed steps: {match['macs_ratio']:.3f}x the multiply-adds, "
            f"{match['speedup']:.2f}x the images/s (confidence exit, FashionMNIST, tiny DSA-MoE)")
    return pieces
