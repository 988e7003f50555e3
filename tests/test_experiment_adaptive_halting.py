"""experiments/adaptive_halting/tables.py: the study's tables from the JSON kept in its results/."""
import copy
import json
import pathlib
import shutil

from tools.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'adaptive_halting'
tables = import_file(STUDY / 'tables.py')


def _learned_head(beta_result: dict, top1_16: float, matching) -> dict:
    result = copy.deepcopy(beta_result)
    result['fixed'][-1]['top1'] = top1_16
    result['matching'] = matching
    return result


def test_ponder_weights_table_has_one_row_per_kl_weight(tmp_path):
    measured = json.loads((STUDY / 'results' / 'halting.json').read_text())
    (tmp_path / 'halting.json').write_text(json.dumps(measured))
    (tmp_path / 'halting_beta1.json').write_text(json.dumps(_learned_head(measured, 77.5, None)))
    (tmp_path / 'halting_beta0.001.json').write_text(json.dumps(_learned_head(
        measured, 79.0, {'threshold': 0.3, 'top1': 79.1, 'mean_steps': 2.5, 'macs_ratio': 0.2, 'speedup': 4.0})))
    by_beta = tables.ponder_weight_results(tmp_path)
    assert list(by_beta) == [0.001, tables.DEFAULT_PONDER_BETA, 1.0]
    rows = tables.ponder_weight_table(by_beta).splitlines()[2:]
    assert rows[0].startswith('| 0.001 |') and '| 79.00 |' in rows[0]
    assert '| 0.3 | 79.10 | 2.50 | 0.200 | 4.00x |' in rows[0]
    assert rows[1].startswith('| 0.01 |') and rows[1].endswith(
        f"| {measured['matching']['threshold']:g} | {measured['matching']['top1']:.2f} "
        f"| {measured['matching']['mean_steps']:.2f} | {measured['matching']['macs_ratio']:.3f} "
        f"| {measured['matching']['speedup']:.2f}x |")
    assert rows[2].startswith('| 1 |') and rows[2].endswith('| none | — | — | — | — |')


def test_full_data_recipe_pieces_come_from_their_own_folder(tmp_path):
    for name in ('confidence.json', 'change.json', 'halting.json'):
        shutil.copy(STUDY / 'results' / name, tmp_path / name)
    pieces = tables.tables(tmp_path)
    headline = pieces['headline']
    assert pieces['full_data_confidence'].startswith('not measured yet')
    assert pieces['ponder_weights'].startswith('not measured yet')  # one ponder weight is no sweep
    (tmp_path / 'full_data').mkdir()
    confidence = json.loads((STUDY / 'results' / 'confidence.json').read_text())
    confidence['eval_images'] = 10000
    (tmp_path / 'full_data' / 'confidence.json').write_text(json.dumps(confidence))
    pieces = tables.tables(tmp_path)
    assert pieces['full_data_confidence'] == pieces['confidence']
    assert 'of 10000 images run past step 1' in pieces['full_data_confidence_hard_images']
    assert pieces['full_data_change'].startswith('not measured yet')
    assert pieces['headline'] == headline  # the headline is the 6,000-image recipe's


def test_the_short_piece_states_the_headlines_confidence_exit_in_plain_words(tmp_path):
    pieces = tables.tables(STUDY / 'results')
    short, headline = pieces['short'], pieces['headline']
    assert len(short) <= 150 and '`' not in short and '_' not in short
    exit_top1, rest = headline.split('% with ', 1)
    full_top1 = rest.split(' vs ', 1)[1].split('%')[0]
    # e.g. "+0.12 (-0.05 to +0.29) points, paired 95% interval", or that no image's answer changed
    change = headline.split(' fixed steps (', 1)[1].split('): ')[0].removesuffix(', paired 95% interval')
    macs, speed = headline.split('): ', 1)[1].split('x the multiply-adds, ')
    assert short.startswith(f'confidence exit {exit_top1}% top-1 vs {full_top1}% at ')
    assert f'{change}, {macs}x multiply-adds, {speed.split("x")[0]}x images/s' in short
    assert short.endswith('(tiny DSA-MoE)') == ('held-out' in headline)
    confidence = json.loads((STUDY / 'results' / 'confidence.json').read_text())
    # a difference of zero with no interval means the same images right: said so, never "+0.00 (+0.00 to +0.00)"
    vs = next(t for t in confidence['thresholds'] if t['threshold'] == confidence['matching']['threshold'])[
        'vs_fixed'][str(confidence['fixed'][-1]['steps'])]
    vs.update(gain=0., ci95=0.)
    assert 'right on exactly the same images, ' in tables.short(confidence)
    vs.update(gain=0.1, ci95=0.2)
    assert '+0.10 (-0.10 to +0.30) points, ' in tables.short(confidence)
    # a threshold chosen on the evaluation images says so; no matching threshold reads as the headline does
    confidence['matching']['chosen_on'] = 'the evaluation images themselves'
    assert tables.short(confidence).endswith('images/s (threshold chosen on test)')
    confidence['matching'] = None
    (tmp_path / 'confidence.json').write_text(json.dumps(confidence))
    pieces = tables.tables(tmp_path)
    assert pieces['short'] == pieces['headline'] == (
        f"no confidence exit reaches the {confidence['fixed'][-1]['top1']:.2f}% of 16 fixed steps")
