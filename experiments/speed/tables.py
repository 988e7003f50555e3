"""The speed study's tables, from ``results/<run>/``: one folder per ``run.sh`` run (its benchmarks' JSON and
``provenance.json``); a folder without ``provenance.json`` holds JSON whose date and commit were not recorded.

Each table reads the newest run that holds its benchmark (runs ordered by their recorded start, unrecorded first).
"""
import json
import pathlib
from typing import Dict, List, Tuple

from tools.generated_markdown import markdown_table

BENCHMARKS = ('efficiency', 'entmax_speed', 'entmax_speed_1thread', 'recursive_train_speed',
              'recursive_train_speed_b128', 'recursive_train_speed_b256', 'layer_floor', 'token_fusion_cost',
              'compile_speed', 'spatial_train_speed', 'tome_cost', 'tome_families')


def _runs(results: pathlib.Path):
    """Run folders, oldest first, each with its provenance (``{}`` where not recorded)."""
    runs = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        provenance = folder / 'provenance.json'
        runs.append((folder, json.loads(provenance.read_text()) if provenance.exists() else {}))
    return sorted(runs, key=lambda run: run[1].get('started', ''))


def _latest(results: pathlib.Path) -> Dict[str, Tuple[dict, dict, str]]:
    """For every benchmark: (its JSON, its provenance, the run folder's name) from the newest run holding it."""
    found = {}
    for folder, provenance in _runs(results):
        for name in BENCHMARKS:
            if (folder / f'{name}.json').exists():
                found[name] = (json.loads((folder / f'{name}.json').read_text()), provenance, folder.name)
    return found


def _x(ratio: float) -> str:
    return f'{ratio:.2f}x'


def efficiency_table(report: dict) -> str:
    rows = []
    for name, r in report.items():
        rows.append([f'`{name}`', f'{r["stored_params"] / 1e6:.2f}M', f'{r["active_params"] / 1e6:.2f}M',
                     f'{r["block_macs_per_token_d2"]:.2f} d^2', f'{r.get("block_macs_ratio", 1.0):.3f}',
                     f'{r["forward_macs_per_image"] / 1e9:.3f}', f'{r.get("forward_macs_ratio", 1.0):.3f}',
                     f'{r["mean_sparsity"]:.3f}'])
    return markdown_table(['model', 'stored params', 'active params', 'block MACs per token', 'block ratio',
                           'forward GMACs', 'forward ratio', 'mean attention sparsity'], rows)


def entmax_table(report: dict) -> str:
    rows = []
    for group, cases in report['results'].items():
        for case, r in cases.items():
            rows.append([group, case, f'{r["seconds"] * 1e3:.1f}', _x(r['vs_softmax'])])
        if group in report.get('lower_bound', {}):  # runs before the bound was measured lack it
            bound = report['lower_bound'][group]
            passes = bound['passes_over_the_scores']
            what = f'lower bound: softmax SDPA + {passes} pass{"es" if passes > 1 else ""} over the scores'
            rows.append([group, what, f'{bound["seconds"] * 1e3:.1f}', _x(bound['vs_softmax'])])
    return markdown_table(['forward + backward', 'attention', 'median ms', 'time vs softmax SDPA'], rows)


def entmax_profile_table(report: dict) -> str:
    rows = []
    for group, split in report['profile_ms'].items():
        for case, parts in split.items():
            rows += [[group, case, part, f'{ms:.2f}'] for part, ms in parts.items()]
    return markdown_table(['operator', 'attention', 'part (torch.profiler, self CPU time)',
                           'ms per forward + backward'], rows)


KERNEL_CHANGE_RUN = '20261205-0312'  # holds the same benchmark on the kernel before the change, beside its own


def entmax_kernel_change_table(run: pathlib.Path) -> str:
    """The entmax benchmark on the CPU kernel before (commit 716c9a6) and after its change, ratios to softmax SDPA and
    the profile's entmax parts."""
    before = json.loads((run / 'entmax_speed_kernel_716c9a6.json').read_text())
    after = json.loads((run / 'entmax_speed.json').read_text())
    ours = 'entmax-1.5 (timm_recursive)'
    rows = []
    for group in after['results']:
        row = [group] + [_x(r['results'][group][ours]['vs_softmax']) for r in (before, after)]
        if group in after['profile_ms']:
            row += [f'{r["profile_ms"][group][ours][part]:.2f}' for part in (
                'entmax-1.5 forward (threshold solve)', 'entmax-1.5 backward') for r in (before, after)]
        else:
            row += ['—'] * 4
        rows.append(row)
    return markdown_table(['forward + backward', 'entmax / softmax SDPA, kernel before', 'after',
                           'profile: entmax forward ms, before', 'after', 'entmax backward ms, before', 'after'], rows)


def _entmax_ratios(report: dict) -> List[str]:
    """entmax / softmax time of the ViT-S operator, the whole ViT-S and the whole ViT-Ti (runs from before the
    ViT-Ti cases name their groups without the model and lack it)."""
    r = report['results']
    if 'whole model (ViT-S)' in r:
        return [_x(r['attention operator (ViT-S)']['entmax-1.5 (timm_recursive)']['vs_softmax']),
                _x(r['whole model (ViT-S)']['entmax-1.5 (timm_recursive)']['vs_softmax']),
                _x(r['whole model (ViT-Ti)']['entmax-1.5 (timm_recursive)']['vs_softmax'])
                if 'whole model (ViT-Ti)' in r else '—']
    return [_x(r['attention operator']['entmax-1.5 (timm_recursive)']['vs_softmax']),
            _x(r['whole model']['ViT-S entmax-1.5 (timm_recursive)']['vs_softmax']), '—']


def train_table(report: dict) -> str:
    baseline = next(iter(report['results']))
    rows = [[f'`{name}`', f'{r["median_s_per_step"]:.2f}', f'{min(r["repeats_s"]):.1f}-{max(r["repeats_s"]):.1f}',
             f'{r["images_per_s"]:.2f}', _x(r['speedup_vs_' + baseline])] for name, r in report['results'].items()]
    return markdown_table(['model', 'median s/step', 'range of the repeats (s)', 'images/s',
                           f'images/s vs `{baseline}`'], rows)


def across_runs_table(results: pathlib.Path) -> str:
    """The main ratios of every run in ``results/``, to show how much they move between runs on a shared CPU."""
    rows = []
    for folder, provenance in _runs(results):
        train, entmax = folder / 'recursive_train_speed.json', folder / 'entmax_speed.json'
        if not (train.exists() or entmax.exists()):
            continue
        row = [f'`{folder.name}`', provenance.get('started', 'not recorded')]
        if train.exists():
            r = json.loads(train.read_text())['results']
            mlp = r['recursive_sa_mlp_cifar']['images_per_s']
            row += [_x(r[name]['images_per_s'] / mlp) if name in r else '—'
                    for name in ('recursive_sa_moe_cifar', 'recursive_dsa_moe_cifar')]
            row += [_x(r[f'{name}:grad_window=0']['images_per_s'] / r[name]['images_per_s'])
                    if f'{name}:grad_window=0' in r else '—'
                    for name in ('recursive_sa_mlp_cifar', 'recursive_dsa_moe_cifar')]
        else:
            row += ['—'] * 4
        if entmax.exists():
            row += _entmax_ratios(json.loads(entmax.read_text()))
        else:
            row += ['—'] * 3
        rows.append(row)
    return markdown_table(['run', 'started', 'SA-MoE / SA-MLP images/s', 'DSA-MoE / SA-MLP images/s',
                           'SA-MLP detached / default images/s', 'DSA-MoE detached / default images/s',
                           'entmax / softmax time, ViT-S attention operator', 'entmax / softmax time, ViT-S',
                           'entmax / softmax time, ViT-Ti'], rows)


def token_fusion_table(report: dict) -> str:
    first = next(iter(report['results'].values()))
    # inference columns, then training ones (``--train-batch-sizes``)
    batches = ([key for key in first if key.startswith('batch_')]
               + [key for key in first if key.startswith('train_batch_')])
    rows = []
    for name, r in report['results'].items():
        added = r['gmacs']['clustering_gmacs'] + r['gmacs'].get('merging_gmacs', 0.)
        row = [f'`{name}`', f'{r["gmacs"]["gmacs"]:.3f}', f'{added:.4f}']
        for b in batches:
            row += [f'{r[b]["images_per_s"]:.1f}', _x(r[b]['speedup'])]
        rows.append(row)
    header = ['model', 'GMACs', 'of which clustering or merging (analytic)']
    for b in batches:
        header += [f'{"training " if b.startswith("train_") else ""}images/s, batch {b.split("_")[-1]}', 'speed-up']
    return markdown_table(header, rows)


def compile_table(report: dict) -> str:
    summary = report['summary']
    rows = [[name, f'{r["median_s_per_step"]:.2f}', f'{r["images_per_s"]:.1f}',
             f'{min(r["repeats_s"]):.1f}-{max(r["repeats_s"]):.1f}'] for name, r in report['results'].items()]
    table = markdown_table(['training step', 'median s/step', 'images/s', 'range of the repeats (s)'], rows)
    return table + '\n\n' + markdown_table(
        ['compiled vs eager', 'compilation (min, wall)', 'graph breaks', 'graphs compiled'],
        [[_x(summary['speedup_compiled_vs_eager']), f'{summary["compile_s"] / 60:.0f}', summary['graph_breaks'],
          summary['graphs_compiled']]])


# the throughput study of DSA-MoE's training step (results/20261205-0125): its parts, as
# ``benchmarks/profile_train_step.py`` names them (function, then operator or backward node)
THROUGHPUT_STUDY = '20261205-0125'
_LINEAR = ('aten::linear', 'AddmmBackward0', 'MmBackward0', 'TBackward0')
_DSA = ('sparse_attention:_project', 'sparse_attention:forward')
_INDEXER_OPS = ('aten::topk', 'aten::sigmoid', 'SigmoidBackward0', 'aten::sub', 'SubBackward0', 'aten::detach')
_PROFILE_PARTS = (
    ("expert MLPs' matmuls (forward + backward)", lambda f, op: f == 'mlp:forward' and 'elu' not in op.lower()),
    ("attention projections (qkv, the indexer's query and key, output)", lambda f, op: f in _DSA and op in _LINEAR),
    ('attention core (q.k and p.v matmuls, key/value gather, softmax, gate)',
     lambda f, op: f == 'sparse_attention:_softmax_short_rows' or (
         f == 'sparse_attention:forward' and op not in _LINEAR + _INDEXER_OPS)),
    ('conv encoder', lambda f, op: f == 'recursive_classifier:_encode'),
    ('MoE dispatch (sort, gather, gate multiply, scatter-add, split)',
     lambda f, op: f == 'mixture_of_experts:_dispatch'),
    ('of which the sort (`argsort`)', lambda f, op: f == 'mixture_of_experts:_dispatch' and op == 'aten::argsort'),
    ('expert GELU', lambda f, op: f == 'mlp:forward' and 'elu' in op.lower()),
    ('layer norms and residuals',
     lambda f, op: f in ('recursive_classifier:forward', 'recursive_classifier:_transform')),
    ('indexer: mean query, scores, sigmoid gate, top-k',
     lambda f, op: (f == 'sparse_attention:_project' and op not in _LINEAR)
     or (f == 'sparse_attention:forward' and op in _INDEXER_OPS)),
    ('of which the top-k', lambda f, op: f == 'sparse_attention:forward' and op == 'aten::topk'),
    ('router (linear, softmax, top-2, renormalisation)', lambda f, op: f == 'mixture_of_experts:route'),
    ('history concatenation', lambda f, op: f == 'recursive_classifier:_recurse' and op == 'aten::cat'),
    ('MoE auxiliary loss (counts, balance loss)',
     lambda f, op: f in ('mixture_of_experts:load_balancing_loss', 'mixture_of_experts:expert_counts')),
)


def _profile_share(profile: dict, part) -> float:
    """Share of the profiled step in the operators that ``part(function, operator)`` selects."""
    return sum(r['share'] for r in profile['operators'] if part(*r['name'].split(' ', 1)))


def throughput_profile_table(study: pathlib.Path) -> str:
    """Shares of DSA-MoE's profiled training step by part, before and after the throughput study's changes."""
    before, after = (json.loads((study / f'profile_dsa_moe_{commit}.json').read_text())
                     for commit in ('f936afe', 'a2ec2cd'))
    rows = [[name, f'{_profile_share(before, part):.2%}', f'{_profile_share(after, part):.2%}']
            for name, part in _PROFILE_PARTS]
    return markdown_table(['part of the DSA-MoE step', 'before (`f936afe`)', 'after (`a2ec2cd`)'], rows)


def _train_ratio(path: pathlib.Path) -> str:
    if not path.exists():
        return 'not run'
    r = json.loads(path.read_text())['results']
    dsa, mlp = r['recursive_dsa_moe_cifar'], r['recursive_sa_mlp_cifar']
    return f'{_x(dsa["speedup_vs_recursive_sa_mlp_cifar"])} ({dsa["median_s_per_step"]:.2f} s against ' \
           f'{mlp["median_s_per_step"]:.2f} s)'


def _train_ratio_files(results: pathlib.Path, batch: int) -> List[pathlib.Path]:
    """Every DSA-MoE / SA-MLP training run at ``batch``: the throughput study's commits, then the later runs."""
    study = results / THROUGHPUT_STUDY
    return (sorted(f for f in study.glob(f'train_speed_b{batch}_*.json') if 'threads' not in f.name)
            + [f / f'recursive_train_speed_b{batch}.json' for f, _ in _runs(results)
               if (f / f'recursive_train_speed_b{batch}.json').exists()])


def throughput_range(results: pathlib.Path) -> str:
    """The spread of the one-thread DSA-MoE / SA-MLP ratio over every run at batch 128 and 256."""
    spans = []
    for batch in (128, 256):
        ratios = [json.loads(f.read_text())['results']['recursive_dsa_moe_cifar']['speedup_vs_recursive_sa_mlp_cifar']
                  for f in _train_ratio_files(results, batch)]
        spans.append(f'{min(ratios):.2f}x to {max(ratios):.2f}x at batch {batch}')
    return ' and '.join(spans)


def throughput_ratio_table(results: pathlib.Path) -> str:
    """DSA-MoE / SA-MLP images/s at batch 128 and 256 at each commit of the throughput study, then in every later run of
    ``recursive_train_speed_b128`` / ``_b256``."""
    study = results / THROUGHPUT_STUDY
    rows = [[f'`{commit}` ({what})', _train_ratio(study / f'train_speed_b128_{commit}.json'),
             _train_ratio(study / f'train_speed_b256_{commit}.json'), '3']
            for commit, what in (('f936afe', 'before'), ('f1e1103', 'change 1'), ('a2ec2cd', 'changes 1 and 2'))]
    for folder, provenance in _runs(results):
        files = [folder / f'recursive_train_speed_b{batch}.json' for batch in (128, 256)]
        if any(f.exists() for f in files):
            repeats = {json.loads(f.read_text())['config']['repeats'] for f in files if f.exists()}
            rows.append([f'`{provenance.get("commit", "not recorded")[:7]}` (run `{folder.name}`)',
                         *(_train_ratio(f) for f in files), '/'.join(map(str, sorted(repeats)))])
    return markdown_table(['commit', 'batch 128: DSA-MoE / SA-MLP images/s', 'batch 256', 'repeats'], rows)


def throughput_bound(results: pathlib.Path) -> str:
    """DSA-MoE's block layers against SA-MLP's, with and without their machinery (the layers against only their
    linear layers, one interleaved layer_floor run), and what 1.8x would ask of the training step of the same run
    folder (a separate benchmark: a rough magnitude)."""
    folder = [f for f, _ in _runs(results)
              if (f / 'layer_floor.json').exists() and (f / 'recursive_train_speed_b128.json').exists()][-1]
    layers = {name: r['seconds_per_step'] for name, r in json.loads((folder / 'layer_floor.json').read_text())[
        'results'].items()}
    steps = json.loads((folder / 'recursive_train_speed_b128.json').read_text())['results']
    dsa_step, mlp_step = (steps[m]['median_s_per_step'] for m in ('recursive_dsa_moe_cifar', 'recursive_sa_mlp_cifar'))
    moe_linears = next(v for k, v in layers.items() if k.startswith('moe experts linears'))
    dsa_layers = layers['dsa layer'] + layers['moe layer']
    mlp_layers = layers['sdpa layer (timm Attention)'] + layers['mlp layer']
    dsa_linears = layers['dsa linears (qkv, proj)'] + moe_linears
    mlp_linears = layers['attention linears (qkv, proj)'] + layers['mlp linears']
    attention_core = layers['dsa layer'] - layers['dsa linears (qkv, proj)']
    moe_machinery = layers['moe layer'] - moe_linears
    needed = dsa_step - mlp_step / 1.8
    return (f'in run `{folder.name}`, DSA-MoE\'s block layers take {dsa_layers:.2f} s per step against SA-MLP\'s '
            f'{mlp_layers:.2f} s ({mlp_layers / dsa_layers:.2f}x), their linear layers alone {dsa_linears:.2f} s '
            f'against {mlp_linears:.2f} s ({dsa_linears / mlp_linears:.3f}x the time, {mlp_linears / dsa_linears:.2f}x '
            f'the speed). DSA-MoE\'s machinery costs {attention_core + moe_machinery:.2f} s per step (attention core '
            f'and indexer {attention_core:.2f} s, routing, dispatch and GELU {moe_machinery:.2f} s). The training step '
            f'adds what both models share (encoder, norms, loss, AdamW), which pulls the ratio further toward 1: '
            f'the same folder\'s batch-128 step measured {mlp_step / dsa_step:.2f}x, and 1.8x would need '
            f'{needed:.2f} s less per DSA-MoE step, {100 * needed / (attention_core + moe_machinery):.0f}% of the '
            f'machinery\'s time (two benchmarks run minutes apart: a rough magnitude)')


def layer_floor_table(report: dict) -> str:
    rows = [[name, f'{r["seconds_per_layer"]:.3f}', f'{r["seconds_per_step"]:.2f}']
            for name, r in report['results'].items()]
    return markdown_table(['layer, or only its linear layers', 's per layer (one training step\'s inputs)',
                           f's per step (x{next(iter(report["results"].values()))["blocks"]} blocks)'], rows)


def provenance_table(found: Dict[str, Tuple[dict, dict, str]]) -> str:
    rows = []
    for name in BENCHMARKS:
        if name not in found:
            continue
        report, provenance, run = found[name]
        config = report.get('config', report)
        threads = config.get('threads', provenance.get('omp_num_threads', 'not recorded'))
        ran = provenance.get('benchmarks', {}).get(name, {})
        wall = f'{ran["wall_s"] / 60:.1f} min' if 'wall_s' in ran else 'not recorded'
        rows.append([name, f'`results/{run}/{name}.json`', provenance.get('started', 'not recorded'),
                     provenance.get('commit', 'not recorded'), provenance.get('machine', 'not recorded'), threads,
                     wall])
    return markdown_table(['benchmark', 'file', 'started', 'commit', 'machine', 'threads', 'wall time'], rows)


def tables(results: pathlib.Path) -> Dict[str, str]:
    found = _latest(results)
    pieces = {'provenance': provenance_table(found), 'across_runs': across_runs_table(results)}
    makers = {'efficiency': efficiency_table, 'entmax_speed': entmax_table, 'entmax_speed_1thread': entmax_table,
              'recursive_train_speed': train_table, 'spatial_train_speed': train_table,
              'tome_cost': token_fusion_table, 'tome_families': token_fusion_table,
              'token_fusion_cost': token_fusion_table, 'compile_speed': compile_table}
    for name, make in makers.items():
        pieces[name] = (make(found[name][0]) if name in found else
                        f'not measured yet: `experiments/speed/run.sh OUT {name}` measures it')
    pieces['entmax_kernel_change'] = entmax_kernel_change_table(results / KERNEL_CHANGE_RUN)
    if 'entmax_speed' in found and 'profile_ms' in found['entmax_speed'][0]:
        pieces['entmax_profile'] = entmax_profile_table(found['entmax_speed'][0])
    pieces['commands'] = '\n'.join(
        f'- {name}: `{found[name][1]["benchmarks"][name]["command"]}`' if found[name][1] else f'- {name}: not recorded'
        for name in BENCHMARKS if name in found)
    pieces['throughput_profile'] = throughput_profile_table(results / THROUGHPUT_STUDY)
    pieces['throughput_ratios'] = throughput_ratio_table(results)
    if 'layer_floor' in found:
        pieces['layer_floor'] = layer_floor_table(found['layer_floor'][0])
        pieces['throughput_bound'] = throughput_bound(results)
    pieces['throughput_range'] = throughput_range(results)
    fuse = found['token_fusion_cost'][0]['results']
    pieces['token_fusion_batch_32'] = ', '.join(
        f'keep {name.split("=")[1]} {r["batch_32"]["speedup"]:.2f}x' for name, r in fuse.items()
        if name in ('deit_s_tokenfuse keep=0.673', 'deit_s_tokenfuse keep=0.7') and 'batch_32' in r)
    dense = fuse['deit_small_patch16_224']['gmacs']['gmacs']
    pieces['token_fusion_bound'] = ', '.join(
        f'keep {name.split("=")[1]}: {dense / r["gmacs"]["gmacs"]:.2f}x fewer MACs, {r["batch_32"]["speedup"]:.2f}x '
        f'the images/s' for name, r in fuse.items()
        if name in ('deit_s_tokenfuse keep=0.673', 'deit_s_tokenfuse keep=0.7') and 'batch_32' in r)
    h = headline_figures(found)
    pieces['headline'] = (
        f'DSA-MoE trains at {h["train_ratio"]} the images/s of SA-MLP (both of the cifar size, d=512, depth 4; '
        f'CPU, batch {h["train_batch"]}, interleaved); deit_s_tokenfuse at keep 0.7: '
        f'{h["keep_07_gmacs"]:.3f} GMACs, '
        f'{h["keep_07_speedup"]} the images/s of DeiT-S; entmax-1.5 ViT-S / ViT-Ti forward + backward '
        f'{h["entmax_vit_s"]} / {h["entmax_vit_ti"]} softmax SDPA\'s time')
    pieces['short'] = short(h)
    return pieces


SHORT_LIMIT = 150  # characters: the README's results table cell


def headline_figures(found: Dict[str, Tuple[dict, dict, str]]) -> Dict:
    """The headline's ratios, from the newest run of each benchmark: DSA-MoE / SA-MLP training images/s (and its
    batch), DeiT-S with token fusion at keep 0.7 (GMACs, images/s at batch 32 against DeiT-S), entmax-1.5 / softmax
    SDPA forward + backward time of the whole ViT-S and ViT-Ti."""
    train = found['recursive_train_speed'][0]['results']
    dsa, mlp = train['recursive_dsa_moe_cifar'], train['recursive_sa_mlp_cifar']
    keep_07 = found['token_fusion_cost'][0]['results']['deit_s_tokenfuse keep=0.7']
    _, entmax_vit_s, entmax_vit_ti = _entmax_ratios(found['entmax_speed'][0])
    return {'train_ratio': _x(dsa['images_per_s'] / mlp['images_per_s']),
            'train_batch': found['recursive_train_speed'][0]['config']['batch_size'],
            'keep_07_gmacs': keep_07['gmacs']['gmacs'], 'keep_07_speedup': _x(keep_07['batch_32']['speedup']),
            'entmax_vit_s': entmax_vit_s, 'entmax_vit_ti': entmax_vit_ti}


def short(h: Dict) -> str:
    """The headline's ratios for a newcomer, in at most ``SHORT_LIMIT`` characters: ViT-Ti's entmax ratio where room
    allows."""
    text = (f'CPU: cifar-size DSA-MoE trains {h["train_ratio"]} as fast as SA-MLP; '
            f'token fusion (keep 0.7) runs DeiT-S {h["keep_07_speedup"]} as fast; ')
    entmax = [f'entmax ViT-S takes {h["entmax_vit_s"]} softmax\'s time', f'entmax {h["entmax_vit_s"]} softmax\'s time']
    if h['entmax_vit_ti'] != '—':
        entmax.insert(0, f'entmax ViT-S / ViT-Ti take {h["entmax_vit_s"]} / {h["entmax_vit_ti"]} softmax\'s time')
    return next((text + e for e in entmax if len(text + e) <= SHORT_LIMIT), text + entmax[-1])
