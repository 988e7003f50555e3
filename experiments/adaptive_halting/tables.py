"""The adaptive halting study's tables, from results/<criterion>.json (``run.sh`` writes them)."""
import json
import pathlib
from typing import Dict

from timm_recursive.analysis.adaptive_halting import still_running_table, threshold_table
from timm_recursive.analysis.generated_markdown import markdown_table, pct
from timm_recursive.hub.cards import public_command, strip_local_paths

CRITERIA = ('confidence', 'change', 'halting')
# the training run each criterion's model comes from (results/<folder>/summary.json)
TRAINING = {'confidence': 'training', 'change': 'training', 'halting': 'training_ponder_net'}


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


def _chosen(result: Dict) -> Dict:
    """The threshold the detail tables show: the cheapest that matches the full recursion, else the most accurate."""
    threshold = result['matching']['threshold'] if result['matching'] else \
        max(result['thresholds'], key=lambda r: r['top1'])['threshold']
    return next(r for r in result['thresholds'] if r['threshold'] == threshold)


def _hard_images(result: Dict) -> str:
    row = _chosen(result)
    hard = row['hard_images']
    name = f"{result['criterion']} threshold {row['threshold']:g}"
    if not hard['images']:
        return f'{name} halts every image at step 1: no image runs on'
    gain = hard['vs_step1']
    return (f"{name}: {hard['images']} of {result['eval_images']} images run past step 1; their top-1 is "
            f"{pct(hard['top1_step1'])}% at step 1 and {pct(hard['top1_halted'])}% at their halting step "
            f"({gain['gain']:+.2f} ± {gain['ci95']:.2f} points, paired)")


def _provenance(result: Dict) -> str:
    return (f"{result['criterion']}: weights after epoch {result['checkpoint_epoch']} of {result['run_epochs']}, "
            f"measured {result['date']}, commit {result['commit'] or 'not recorded'}, {result['machine']}, "
            f"{result['timing']['threads']} threads, {result['wall_s']:.0f} s")


def tables(results: pathlib.Path) -> Dict[str, str]:
    data = {c: json.loads((results / f'{c}.json').read_text()) for c in CRITERIA if (results / f'{c}.json').exists()}
    missing = 'not measured yet: `experiments/adaptive_halting/run.sh OUTPUT_ROOT --save` measures it'
    suffixes = ('', '_histogram', '_matching', '_provenance', '_still_running', '_hard_images')
    pieces: Dict[str, str] = {f'{c}{suffix}': missing for c in CRITERIA for suffix in suffixes}
    for criterion, result in data.items():
        pieces[criterion] = threshold_table(result)
        pieces[f'{criterion}_histogram'] = _histogram(result)
        pieces[f'{criterion}_matching'] = _matching(result)
        pieces[f'{criterion}_provenance'] = _provenance(result)
        if 'still_running' in result['thresholds'][0]:  # measured since the study records it
            pieces[f'{criterion}_still_running'] = still_running_table(result, _chosen(result)['threshold'])
            pieces[f'{criterion}_hard_images'] = _hard_images(result)
    for folder in sorted(set(TRAINING.values())):
        key = f'{folder}_provenance'
        if not (results / folder / 'summary.json').exists():
            pieces[key] = missing
            continue
        training = json.loads((results / folder / 'summary.json').read_text())
        pieces[key] = (
            f"trained {training['epochs']} epochs on {training['train_images']} images in "
            f"{training['wall_time_s'] / 60:.1f} min ({training['hardware']}, "
            f"{strip_local_paths(training['dataset_source'])}): `{public_command(training['command'])}`")
    confidence = data['confidence']
    full, match = confidence['fixed'][-1], confidence['matching']
    if match is None:
        pieces['headline'] = f"no confidence exit reaches the {pct(full['top1'])}% of 16 fixed steps"
    else:
        pieces['headline'] = (
            f"{pct(match['top1'])}% with {match['mean_steps']:.2f} steps per image on average vs "
            f"{pct(full['top1'])}% at {full['steps']} fixed steps: {match['macs_ratio']:.3f}x the multiply-adds, "
            f"{match['speedup']:.2f}x the images/s (confidence exit, FashionMNIST, tiny DSA-MoE)")
    learned = data.get('halting')
    if learned is not None and learned['matching'] is not None:
        m, f = learned['matching'], learned['fixed'][-1]
        pieces['headline'] += (f"; a learned PonderNet head: {pct(m['top1'])}% with {m['mean_steps']:.2f} steps vs "
                               f"{pct(f['top1'])}% at {f['steps']}, {m['macs_ratio']:.3f}x the multiply-adds")
    return pieces
