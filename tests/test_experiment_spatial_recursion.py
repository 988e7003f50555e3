"""experiments/spatial_recursion: the schedule of its runs and the tables made from their records."""
import json
import pathlib

from tools.generated_markdown import import_file
from tools.study_runs import schedule

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'spatial_recursion'
study_run = import_file(STUDY / 'run.py')
study_tables = import_file(STUDY / 'tables.py')


def test_every_cells_first_seed_comes_before_any_second_seed():
    order = schedule(list(study_run.CELLS.values()))
    seeds = [seed for _, seed in order]
    assert seeds == sorted(seeds) and len(order) == 3 * len(study_run.CELLS)
    assert order[0][0].name == 'dsa_k6_steps16'  # the default design first


def test_the_train_command_holds_out_images_and_never_selects_on_test(tmp_path):
    command = study_run.train_command(study_run.CELLS['dsa_k2_steps16'], 1, tmp_path)
    assert '--val-fraction' not in command or command[command.index('--val-fraction') + 1] != '0'
    assert command[command.index('--seeds') + 1] == '1' and 'topk=2' in command
    assert command[command.index('--max-selection-samples') + 1] == '2000'


def _summary(model, kwargs, seed, test, held_out, date):
    return {'model': model, 'model_kwargs': kwargs, 'seed': seed, 'num_steps': len(test), 'num_classes': 10,
            'test': {'exported': {'epoch': 4, 'top1': test[-1], 'top1_per_step': test}},
            'best': {'epoch': 4, 'selection_top1_per_step': held_out}, 'selection_split': 'train holdout 10%',
            'train_images': 6000, 'selection_images': 2000, 'eval_images': 5000, 'commit': 'a' * 40, 'dirty': False,
            'date': date, 'hardware': 'CPU, 1 thread', 'wall_time_s': 300.0}


def test_tables_choose_the_design_on_held_out_images_and_give_intervals_over_seeds(tmp_path):
    spatial = 'recursive_dsa_moe_spatial_tiny.fashion_mnist'
    runs = {
        # refines on test, not on held-out images: must not be chosen
        'dsa_k6_steps4': [_summary(spatial, {'num_steps': 4}, s, [80., 81., 82., 83. + s], [80., 80., 80., 80.],
                                   f'2026-12-05T10:0{s}Z') for s in range(3)],
        'dsa_k2_steps4_mask_seen': [_summary(spatial, {'num_steps': 4, 'topk': 2, 'mask_seen': True}, s,
                                             [80., 80., 80., 80.5], [79., 80., 81., 82.], f'2026-12-05T11:0{s}Z')
                                    for s in range(3)],
        # a control (random glimpses) is no design to choose, however it does on held-out images
        'dsa_k2_steps4_random': [_summary(spatial, {'num_steps': 4, 'topk': 2, 'glimpse_selection': 'random'}, s,
                                          [70., 71., 72., 73.], [70., 75., 80., 85.], f'2026-12-05T12:0{s}Z')
                                 for s in range(3)],
        'pooled_dsa_k6_steps4': [_summary('recursive_dsa_moe_tiny.fashion_mnist', {'num_steps': 4}, 0,
                                          [85., 85., 85., 85.], [85., 85., 86., 90.], '2026-12-05T09:00Z')],
    }
    for cell, summaries in runs.items():
        for s in summaries:
            folder = tmp_path / cell / f'seed{s["seed"]}'
            folder.mkdir(parents=True)
            (folder / 'summary.json').write_text(json.dumps(s))
    pieces = study_tables.tables(tmp_path)
    # the pooled cell is never the chosen spatial design, however it does on held-out images
    assert '`dsa_k2_steps4_mask_seen`' in pieces['headline'] and '+0.50 (+0.50 to +0.50)' in pieces['headline']
    # the target's status names the other designs (3 seeds, no control) that reach it on test
    assert 'not reached by it; reached by `dsa_k6_steps4` +4.00 (' in pieces['headline']
    row = next(line for line in pieces['design_search'].splitlines() if '`dsa_k6_steps4`' in line)
    assert 'spatial, DSA k=6, MoE, 4 steps' in row and '+4.00 (' in row and '+0.00' in row  # test vs held-out
    assert '| `pooled_dsa_k6_steps4` | pooled, DSA k=6, MoE, 4 steps | 0 |' in pieces['design_search']
    assert '| `dsa_k2_steps4_random` | spatial, DSA k=2 drawn at random, MoE, 4 steps |' in pieces['design_search']
    assert 'one run: no interval' in pieces['design_search']
    macs = [float(v) for v in pieces['macs'].splitlines()[2].split('|')[2:6]]
    assert macs == sorted(macs) and len(set(macs)) == 4  # more steps, more multiply-adds
    assert '| `dsa_k6_steps4` | 2 | 4 | train holdout 10% |' in pieces['provenance']
    assert pieces['short'] == ('image read step by step: step 1 to last +0.50 (+0.50 to +0.50) points, a gain below '
                               'the 1-point target; top-1 80.50% (FashionMNIST, 3 seeds)')


def test_full_data_cells_are_compared_with_the_pooled_full_runs_not_searched(tmp_path, monkeypatch):
    spatial = 'recursive_dsa_moe_spatial_tiny.fashion_mnist'
    pooled_dir = tmp_path / 'pooled'
    monkeypatch.setattr(study_tables, 'POOLED_FULL', pooled_dir)
    records = {
        tmp_path / 'results' / 'dsa_k2_steps4' / 'seed0': _summary(
            spatial, {'num_steps': 4, 'topk': 2}, 0, [70., 71., 72., 73.], [70.] * 4, '2026-12-05T10:00Z'),
        **{tmp_path / 'results' / 'full_dsa_k2_steps4' / f'seed{s}': _summary(
            spatial, {'num_steps': 4, 'topk': 2}, s, [90., 91., 92., 92. + s], [90., 91., 92., 93.],
            f'2026-12-05T12:0{s}Z') for s in range(2)},
        pooled_dir / 'recursive_dsa_moe_tiny' / 'seed0': _summary(
            'recursive_dsa_moe_tiny.fashion_mnist', {'num_steps': 8}, 0, [91.] * 8, [91.] * 8, '2026-12-04T12:00Z'),
    }
    for folder, summary in records.items():
        folder.mkdir(parents=True)
        (folder / 'summary.json').write_text(json.dumps(summary))
    pieces = study_tables.tables(tmp_path / 'results')
    assert 'full_dsa' not in pieces['design_search'] and '`dsa_k2_steps4`' in pieces['headline']
    rows = pieces['full_data'].splitlines()
    assert rows[2].startswith('| `full_dsa_k2_steps4` | spatial, DSA k=2, MoE, 4 steps | 0, 1 | 90.00 (') and \
        rows[2].endswith('| +2.50 (-3.85 to +8.85) | yes |')
    assert rows[3].startswith('| `fashion_mnist_baselines/recursive_dsa_moe_tiny` | pooled, DSA k=6, MoE, 8 steps '
                              '| 0 |')
    assert rows[3].endswith('| no |')
    assert '| `full_dsa_k2_steps4` | 1 |' in pieces['provenance']
    # the headline names the chosen design's full-data result beside the pooled model's and the target
    clause = ("; on all 60,000 images (10 epochs, 2 seeds) {} last step 92.50% (86.15 to 98.85) against the pooled "
              "DSA-MoE's 91.00% (one run: no interval), step 1 -> last +2.50 (-3.85 to +8.85) points (target: 92.5%: "
              "reached)")
    assert pieces['headline'].endswith(clause.format('its'))
    # a later cell chosen over the design the full-data runs are of: those runs are named, and a control's left out
    later = _summary(spatial, {'num_steps': 4, 'topk': 2, 'mask_seen': True}, 0, [60., 70., 70., 70.],
                     [60.] * 3 + [70.], '2026-12-05T13:00Z')
    control = _summary(spatial, {'num_steps': 4, 'topk': 2, 'glimpse_selection': 'random'}, 0, [80.] * 4, [80.] * 4,
                       '2026-12-05T14:00Z')
    for folder, summary in ((tmp_path / 'results' / 'dsa_k2_steps4_mask_seen' / 'seed0', later),
                            (tmp_path / 'results' / 'full_dsa_k2_steps4_random' / 'seed0', control)):
        folder.mkdir(parents=True)
        (folder / 'summary.json').write_text(json.dumps(summary))
    headline = study_tables.tables(tmp_path / 'results')['headline']
    assert headline.startswith('spatial, DSA k=2, MoE, 4 steps, seen tokens masked (`dsa_k2_steps4_mask_seen`')
    assert headline.endswith(clause.format("`dsa_k2_steps4`'s")) and 'random' not in headline


def test_halting_table_compares_each_seeds_exit_with_the_fixed_depth_of_no_more_macs(tmp_path):
    spatial = 'recursive_dsa_moe_spatial_tiny.fashion_mnist'
    fixed = [{'steps': t, 'top1': 60. + t, 'macs_per_image': 10e6 * t} for t in range(1, 5)]
    for seed, (threshold, top1, macs) in enumerate(((0.5, 62.5, 25e6), (0.7, 64.5, 30e6))):
        folder = tmp_path / 'dsa_k2_steps4' / f'seed{seed}'
        folder.mkdir(parents=True)
        (folder / 'summary.json').write_text(json.dumps(_summary(
            spatial, {'num_steps': 4, 'topk': 2}, seed, [61., 62., 63., 64.], [61.] * 4, f'2026-12-05T10:0{seed}Z')))
        (folder / study_tables.HALTING_RESULT).write_text(json.dumps({
            'fixed': fixed, 'matching': {'threshold': threshold},
            'thresholds': [{'threshold': threshold, 'top1': top1, 'mean_steps': 2.5, 'macs_per_image': macs},
                           {'threshold': 0.99, 'top1': 64., 'mean_steps': 4., 'macs_per_image': 40e6}]}))
    assert study_tables.HALTING_RESULT == study_run.HALTING_RESULT
    table = study_tables.tables(tmp_path)['halting'].splitlines()
    # seed 0: 62.5 at 25 M against 2 steps (20 M, 62.0); seed 1: 64.5 at 30 M against 3 steps (30 M, 63.0)
    assert table[2].startswith('| `dsa_k2_steps4` | 2 | 0.5, 0.7 | 63.50 | 2.50 | 27.5 | 2, 3 | +1.00 (')


def test_nothing_measured_says_which_command_measures_it(tmp_path):
    assert all(text.startswith('not measured yet') for text in study_tables.tables(tmp_path).values())


def test_baselines_train_at_28_px_and_count_their_multiply_adds(tmp_path):
    command = study_run.train_command(study_run.CELLS['resnet18'], 0, tmp_path)
    assert '--model-kwargs' not in command and command[command.index('--img-size') + 1] == '28'
    vit = study_run.CELLS['vit_tiny_patch4_depth2']
    summary = {'model': vit.model, 'model_kwargs': dict(kv.split('=') for kv in vit.kwargs), 'num_classes': 10}
    summary['model_kwargs'] = {k: int(v) for k, v in summary['model_kwargs'].items()}
    assert study_tables.design(summary) == 'vit_tiny_patch16_224, img_size=28, patch_size=4, depth=2'
    (macs,) = study_tables.macs_per_step(summary)
    assert 40e6 < macs < 50e6  # near the spatial DSA-MoE's 43 M at 16 steps
    (resnet_macs,) = study_tables.macs_per_step({'model': 'resnet18', 'model_kwargs': {}, 'num_classes': 10})
    assert 30e6 < resnet_macs < 36e6


def test_plot_draws_fixed_depths_exits_and_baselines(tmp_path):
    plot = import_file(STUDY / 'plot.py')
    spatial = 'recursive_dsa_moe_spatial_tiny.fashion_mnist'
    folder = tmp_path / 'dsa_k6_steps4' / 'seed0'
    folder.mkdir(parents=True)
    (folder / 'summary.json').write_text(json.dumps(_summary(spatial, {'num_steps': 4}, 0, [80., 81., 82., 83.],
                                                             [80.] * 4, '2026-12-05T10:00Z')))
    thresholds = [{'threshold': t, 'top1': 80. + t, 'macs_per_image': 1e7 * (1 + t)} for t in (0.5, 0.9)]
    (folder / study_run.HALTING_RESULT).write_text(json.dumps({'thresholds': thresholds}))
    assert plot.halting_curve(tmp_path, 'dsa_k6_steps4') == ([(15.0, 80.5), (19.0, 80.9)], 1)
    assert plot.main([str(tmp_path)]) == 0 and (tmp_path / 'accuracy_vs_macs.png').stat().st_size > 0


def test_glimpse_table_reads_the_kept_reports(tmp_path):
    report = tmp_path / 'dsa_k6_steps16_mask_seen' / 'seed0' / 'report'
    report.mkdir(parents=True)
    (report / 'glimpses.json').write_text(json.dumps({'accuracy': [0.5, 0.625], 'glimpses': {
        'new_regions': [10.0, 4.5], 'coverage': [0.2, 0.3]}}))
    table = study_tables.glimpse_table(tmp_path)
    assert '| `dsa_k6_steps16_mask_seen` | top-1 (%) | 50.0 | 62.5 |' in table
    assert '| `dsa_k6_steps16_mask_seen` | read so far (%) | 20.0 | 30.0 |' in table


def test_short_result_is_a_plain_cell_with_the_headlines_numbers():
    pieces = study_tables.tables(STUDY / 'results')
    short, headline = pieces['short'], pieces['headline']
    assert len(short) <= 150 and '`' not in short and '_' not in short
    change = headline.split('step 1 -> last step ', 1)[1].split(' points', 1)[0]  # the chosen design's, with interval
    last = headline.split('its last step ', 1)[1].split(' ', 1)[0]
    pooled = headline.split('the pooled DSA-MoE ', 1)[1].split(' ', 1)[0]
    assert f'step 1 to last {change} points' in short and f'top-1 {last} vs pooled DSA-MoE {pooled}' in short
