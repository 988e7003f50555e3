"""The adaptive halting study's tables, from results/<criterion>.json (``run.sh`` writes them)."""
import json
import pathlib
from typing import Dict

from timm_recursive.analysis.adaptive_halting import still_running_table, threshold_table
from timm_recursive.analysis.intervals import format_interval
from timm_recursive.hub.cards import public_command, strip_local_paths
from tools.generated_markdown import markdown_table, pct

CRITERIA = ('confidence', 'change', 'halting')
# the training run each criterion's model comes from (results/<folder>/summary.json)
TRAINING = {'confidence': 'training', 'change': 'training', 'halting': 'training_ponder_net'}
# PonderNet's KL weight of the run behind halting.json (run.sh's default --halting-beta); the other
# ponder weights' measurements are halting_beta<BETA>.json, their runs training_ponder_net_beta<BETA>
DEFAULT_PONDER_BETA = 0.01


def _matching(result: Dict) -> str:
    full = result['fixed'][-1]
    match = result['matching']
    if match is None:
        return (f"no {result['criterion']} threshold reaches the {pct(full['top1'])}% of {full['steps']} "
                f"fixed steps")
    return (f"{result['criterion']} threshold {match['threshold']:g}: {pct(match['top1'])}% "
            f"(vs {pct(full['top1'])}% at {full['steps']} fixed steps) with {match['mean_steps']:.2f} steps "
            f"on average, {match['macs_ratio']:.3f}x the multiply-adds and {match['speedup']:.2f}x the images/s; "
            f"chosen on {match.get('chosen_on', 'the evaluation images themselves')}")


def _vs_full(result: Dict, name_interval: bool = False) -> str:
    """The matching threshold's paired difference from the full recursion on the same images, with its 95%
    interval (``vs_fixed`` of that threshold's entry), named as such when ``name_interval``."""
    full = result['fixed'][-1]
    entry = next(t for t in result['thresholds'] if t['threshold'] == result['matching']['threshold'])
    vs = entry['vs_fixed'][str(full['steps'])]
    if vs['gain'] == 0 and vs['ci95'] == 0:  # no image changed from right to wrong or back: nothing to bound
        return 'right on exactly the same images'
    named = ', paired 95% interval' if name_interval else ''
    return f"{format_interval(vs['gain'], vs['ci95'], signed=True)} points{named}"


def _no_match(result: Dict) -> str:
    """The headline when no confidence threshold reaches the full recursion's top-1."""
    return f"no confidence exit reaches the {pct(result['fixed'][-1]['top1'])}% of 16 fixed steps"


def short(confidence: Dict) -> str:
    """The headline's confidence exit in plain words (a README table cell): its top-1 beside the full
    recursion's, their paired difference, its cost, and on which images its threshold was chosen."""
    full, match = confidence['fixed'][-1], confidence['matching']
    if match is None:
        return _no_match(confidence)
    chosen = 'tiny DSA-MoE' if 'held-out' in match.get('chosen_on', '') else 'threshold chosen on test'
    return (f"confidence exit {pct(match['top1'])}% top-1 vs {pct(full['top1'])}% at {full['steps']} steps, "
            f"{_vs_full(confidence)}, {match['macs_ratio']:.3f}x multiply-adds, {match['speedup']:.2f}x images/s "
            f"({chosen})")


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
            f"measured {result['date']}, commit {result['commit'] or 'not recorded'}"
            f"{' (uncommitted changes)' if result.get('dirty') else ''}, {result['machine']}, "
            f"{result['timing']['threads']} threads, {result['wall_s']:.0f} s")


def ponder_weight_results(results: pathlib.Path) -> Dict[float, Dict]:
    """The learned head's measurements by PonderNet KL weight (beta), ascending."""
    found = {}
    if (results / 'halting.json').exists():
        found[DEFAULT_PONDER_BETA] = json.loads((results / 'halting.json').read_text())
    for path in results.glob('halting_beta*.json'):
        found[float(path.stem[len('halting_beta'):])] = json.loads(path.read_text())
    return dict(sorted(found.items()))


def ponder_weight_table(by_beta: Dict[float, Dict]) -> str:
    """One row per ponder weight: the model's fixed readouts at step 1 and at the last step, its halting
    threshold 0.5 (the median of its halting distribution), and the cheapest threshold that keeps its
    own last-step accuracy."""
    rows = []
    for beta, result in by_beta.items():
        fixed = {f['steps']: f for f in result['fixed']}
        median = next((r for r in result['thresholds'] if r['threshold'] == 0.5), None)
        match = result['matching']
        rows.append([
            f'{beta:g}', pct(fixed[1]['top1']), pct(fixed[result['num_steps']]['top1']),
            *([pct(median['top1']), f"{median['mean_steps']:.2f}"] if median else ['—', '—']),
            *([f"{match['threshold']:g}", pct(match['top1']), f"{match['mean_steps']:.2f}",
               f"{match['macs_ratio']:.3f}", f"{match['speedup']:.2f}x"] if match else ['none'] + ['—'] * 4)])
    return markdown_table(['KL weight beta', 'fixed 1 step (%)', 'fixed 16 steps (%)', 'threshold 0.5: top-1 (%)',
                           'threshold 0.5: mean steps', 'cheapest threshold at 16-step accuracy', 'its top-1 (%)',
                           'its mean steps', 'its MACs vs full', 'its speed vs full'], rows)


def _training_provenance(training: Dict) -> str:
    return (f"trained {training['epochs']} epochs on {training['train_images']} images in "
            f"{training['wall_time_s'] / 60:.1f} min ({training['hardware']}, "
            f"{strip_local_paths(training['dataset_source'])}): `{public_command(training['command'])}`")


MISSING = 'not measured yet: `experiments/adaptive_halting/run.sh OUTPUT_ROOT --save` measures it'
FULL_DATA = 'full_data'  # results/full_data/: the full-data 4-epoch recipe (run.sh's usage names the command)


def _load(results: pathlib.Path) -> Dict[str, Dict]:
    return {c: json.loads((results / f'{c}.json').read_text()) for c in CRITERIA if (results / f'{c}.json').exists()}


def recipe_pieces(results: pathlib.Path) -> Dict[str, str]:
    """The tables of one recipe's measurements (one results folder): per criterion its threshold table,
    histogram, matching line, provenance, still-running table and hard-image line, and the training runs'
    provenance."""
    suffixes = ('', '_histogram', '_matching', '_provenance', '_still_running', '_hard_images')
    pieces: Dict[str, str] = {f'{c}{suffix}': MISSING for c in CRITERIA for suffix in suffixes}
    for criterion, result in _load(results).items():
        pieces[criterion] = threshold_table(result)
        pieces[f'{criterion}_histogram'] = _histogram(result)
        pieces[f'{criterion}_matching'] = _matching(result)
        pieces[f'{criterion}_provenance'] = _provenance(result)
        if 'still_running' in result['thresholds'][0]:  # measured since the study records it
            pieces[f'{criterion}_still_running'] = still_running_table(result, _chosen(result)['threshold'])
            pieces[f'{criterion}_hard_images'] = _hard_images(result)
    for folder in sorted(set(TRAINING.values())):
        summary = results / folder / 'summary.json'
        pieces[f'{folder}_provenance'] = _training_provenance(json.loads(summary.read_text())) \
            if summary.exists() else MISSING
    return pieces


def tables(results: pathlib.Path) -> Dict[str, str]:
    pieces = recipe_pieces(results)
    pieces.update({f'{FULL_DATA}_{key}': text for key, text in recipe_pieces(results / FULL_DATA).items()})
    by_beta = ponder_weight_results(results)
    pieces['ponder_weights'] = ponder_weight_table(by_beta) if len(by_beta) > 1 else MISSING
    provenance = []
    for beta in by_beta:
        summary = results / f'training_ponder_net_beta{beta:g}' / 'summary.json'
        if beta != DEFAULT_PONDER_BETA and summary.exists():
            provenance.append(f'- beta {beta:g}: ' + _training_provenance(json.loads(summary.read_text())))
    pieces['ponder_weights_provenance'] = '\n'.join(provenance) or MISSING
    data = _load(results)
    confidence = data['confidence']
    full, match = confidence['fixed'][-1], confidence['matching']
    if match is None:
        pieces['headline'] = _no_match(confidence)
    else:
        pieces['headline'] = (
            f"{pct(match['top1'])}% with {match['mean_steps']:.2f} steps per image on average vs "
            f"{pct(full['top1'])}% at {full['steps']} fixed steps ({_vs_full(confidence, name_interval=True)}): "
            f"{match['macs_ratio']:.3f}x the multiply-adds, {match['speedup']:.2f}x the images/s (confidence exit, "
            f"threshold chosen on {match.get('chosen_on', 'the test images themselves')}; FashionMNIST, tiny DSA-MoE)")
    learned = data.get('halting')
    if learned is not None and learned['matching'] is not None:
        m, f = learned['matching'], learned['fixed'][-1]
        pieces['headline'] += (f"; a learned PonderNet head: {pct(m['top1'])}% with {m['mean_steps']:.2f} steps vs "
                               f"{pct(f['top1'])}% at {f['steps']} ({_vs_full(learned)}), {m['macs_ratio']:.3f}x the "
                               "multiply-adds")
    pieces['short'] = short(confidence)
    return pieces
