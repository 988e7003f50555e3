"""Token fusion: the algorithm's arithmetic, the DeiT models, apply_token_fusion on other timm ViTs, errors."""
import copy
import inspect
import json
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block, VisionTransformer

import timm_recursive  # noqa: F401
from timm_recursive.layers import (
    DEFAULT_IMPORTANCE_SCORE,
    FUSION_MODES,
    ClsRowAttention,
    TokenFusion,
    TokenFusionObjective,
    density_peak_clusters,
    fusion_objective_terms,
    token_sources,
    weighted_cluster_means,
)
from timm_recursive.models import TokenFusionVisionTransformer, apply_token_fusion, record_token_fusion

SMALL = dict(img_size=96)  # a 6x6 patch grid keeps the tests fast


def _outputs_equal(model, reference, x):
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def _fuse_and_record(fusion, *args, **kwargs):
    """The output of one ``TokenFusion`` forward and the record its ``reduction`` hook point was called with."""
    seen = []
    handle = fusion.reduction.register_forward_hook(lambda module, inputs, output: seen.append(inputs[2]))
    try:
        out = fusion(*args, **kwargs)
    finally:
        handle.remove()
    return out, seen[0]


def test_registered_models_point_at_timm_deit_weights():
    assert set(timm.list_models('*_tokenfuse')) == {'deit_t_tokenfuse', 'deit_s_tokenfuse', 'deit_b_tokenfuse'}
    for ours, theirs in (('deit_t_tokenfuse', 'deit_tiny_patch16_224'), ('deit_s_tokenfuse', 'deit_small_patch16_224'),
                         ('deit_b_tokenfuse', 'deit_base_patch16_224')):
        cfg = timm.models.get_pretrained_cfg(f'{ours}.fb_in1k')
        assert cfg.hf_hub_id == f'timm/{theirs}.fb_in1k'
        assert cfg.mean == timm.models.get_pretrained_cfg(f'{theirs}.fb_in1k').mean


def test_deit_state_dict_loads_strictly_and_keep_rate_one_is_deit():
    torch.manual_seed(0)
    reference = timm.create_model('deit_small_patch16_224', **SMALL).eval()
    model = timm.create_model('deit_s_tokenfuse', keep_rate=1.0, **SMALL).eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    assert list(model.state_dict()) == list(reference.state_dict())
    x = torch.randn(2, 3, 96, 96)
    _outputs_equal(model, reference, x)
    apply_token_fusion(model, keep_rate=0.5)
    with torch.no_grad():
        assert not torch.allclose(model(x), reference(x), atol=1e-4)


@pytest.mark.parametrize('name,kwargs', [
    ('deit3_small_patch16_224', dict(img_size=64)),  # LayerScale
    ('vit_small_patch14_reg4_dinov2', dict(img_size=56)),  # LayerScale + 4 register tokens
])
def test_helper_patches_other_vits_without_changing_keys(name, kwargs):
    torch.manual_seed(0)
    reference = timm.create_model(name, **kwargs).eval()
    model = timm.create_model(name, **kwargs).eval()
    model.load_state_dict(reference.state_dict())
    keys = list(model.state_dict())
    x = torch.randn(2, 3, kwargs['img_size'], kwargs['img_size'])
    apply_token_fusion(model, keep_rate=1.0)
    assert list(model.state_dict()) == keys
    _outputs_equal(model, reference, x)
    apply_token_fusion(model, keep_rate=0.5, reduction_blocks=(1, 5))
    assert list(model.state_dict()) == keys
    with record_token_fusion(model) as reductions:
        with torch.no_grad():
            model(x)
    n = model.patch_embed.num_patches
    assert list(reductions) == [1, 5]
    # 4 fused tokens by default
    kept = [math.ceil(n / 2), math.ceil((math.ceil(n / 2) + 4) / 2)]
    assert [r['keep_index'].shape[1] for r in reductions.values()] == kept


def test_qk_norm_model_and_fused_row_matches_the_explicit_attention_map():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=64, patch_size=16, embed_dim=64, depth=4, num_heads=4, qk_norm=True).eval()
    reference = VisionTransformer(img_size=64, patch_size=16, embed_dim=64, depth=4, num_heads=4, qk_norm=True).eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    apply_token_fusion(model, keep_rate=1.0, reduction_blocks=(1, 2))
    _outputs_equal(model, reference, x)
    attn = model.blocks[1].attn
    assert isinstance(attn, ClsRowAttention)
    tokens = torch.randn(2, 17, 64)
    with torch.no_grad():
        attn.fused_attn = True
        out_fused, row_fused = attn.forward_with_cls_row(tokens)
        attn.fused_attn = False
        out_full, row_full = attn.forward_with_cls_row(tokens)
        torch.testing.assert_close(out_fused, reference.blocks[1].attn(tokens), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_fused, out_full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(row_fused, row_full, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(row_fused.sum(-1), torch.ones(2))


def test_token_counts_per_stage_are_as_configured():
    model = timm.create_model('deit_s_tokenfuse').eval()
    seen = []
    hooks = [b.mlp.register_forward_hook(lambda m, i, o: seen.append(o.shape[1])) for b in model.blocks]
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    for h in hooks:
        h.remove()
    # 196 patches at DeiT-S's keep rate 0.673: keep ceil(0.673 * 196) = 132 + 4 fused = 136, then 92 + 4, then 65 + 4;
    # plus [CLS]
    assert seen == model.token_counts() == [197] * 3 + [137] * 3 + [97] * 3 + [70] * 3
    keep_07 = timm.create_model('deit_s_tokenfuse', keep_rate=0.7)
    assert keep_07.token_counts() == [197] * 3 + [143] * 3 + [105] * 3 + [78] * 3
    model = timm.create_model('deit_t_tokenfuse', keep_rate=0.5, reduction_blocks=(0, 11), num_fused_tokens=4)
    assert model.token_counts() == [1 + 98 + 4] * 11 + [1 + 51 + 4]


def test_fused_tokens_are_importance_weighted_means_of_their_members():
    torch.manual_seed(0)
    fusion = TokenFusion(keep_rate=0.5, num_fused_tokens=3)
    B, P, n, C = 3, 2, 20, 8
    x, importance = torch.randn(B, P + n, C), torch.rand(B, n)
    out, record = _fuse_and_record(fusion, x, importance, num_prefix_tokens=P)
    assert out.shape == (B, P + 10 + 3, C)
    for b in range(B):
        assert torch.equal(out[b, :P], x[b, :P])
        top = importance[b].topk(10).indices
        assert torch.equal(record['keep_index'][b], top)
        assert torch.equal(out[b, P:P + 10], x[b, P + top])
        assert set(record['fuse_index'][b].tolist()) == set(range(n)) - set(top.tolist())
        for cluster in range(3):
            members = record['fuse_index'][b][record['assignment'][b] == cluster]
            assert len(members) > 0
            w = importance[b, members]
            expected = (w[:, None] * x[b, P + members]).sum(0) / w.sum()
            torch.testing.assert_close(out[b, P + 10 + cluster], expected)


def test_density_peaks_find_separated_groups_per_image():
    torch.manual_seed(0)
    centres = torch.tensor([[0., 0.], [10., 0.], [0., 10.]])
    labels = torch.arange(3).repeat_interleave(6)
    points = centres[labels] + 0.3 * torch.randn(18, 2)
    perm = torch.randperm(18)
    batch = torch.stack([points, points[perm]])
    assignment = density_peak_clusters(batch, 3, knn=3)
    for b, truth in enumerate((labels, labels[perm])):
        pairs = set(zip(truth.tolist(), assignment[b].tolist()))
        assert len(pairs) == 3  # a one-to-one map between true groups and clusters
    # batched equals one image at a time, and it is deterministic
    assert torch.equal(density_peak_clusters(batch[1:], 3, knn=3)[0], assignment[1])
    assert torch.equal(density_peak_clusters(batch, 3, knn=3), assignment)
    # duplicated tokens do not break ties randomly; every centre is in its own cluster
    same = torch.zeros(1, 5, 4)
    assert sorted(density_peak_clusters(same, 2).unique().tolist()) == [0, 1]
    w = torch.tensor([[1., 3.]])
    means = weighted_cluster_means(torch.tensor([[[0.], [4.]]]), w, torch.zeros(1, 2, dtype=torch.long), 1)
    torch.testing.assert_close(means, torch.tensor([[[3.]]]))


def test_token_sources_track_every_patch_and_cluster_sizes():
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', keep_rate=0.6, **SMALL).eval()
    with record_token_fusion(model) as reductions, torch.no_grad():
        model(torch.randn(2, 3, 96, 96))
    stages = token_sources(list(reductions.values()), 36)
    for stage, count in zip(stages, [22 + 4, 16 + 4, 12 + 4]):  # kept + the 4 fused tokens
        assert stage['sizes'].shape == (2, count) and (stage['sizes'] >= 1).all()
        assert (stage['sizes'].sum(-1) == 36).all() and (stage['token'] >= 0).all()
        assert stage['fused'].sum(-1).tolist() == stage['sizes'][:, count - 4:].sum(-1).tolist()
    assert (stages[0]['sizes'][:, :22] == 1).all()  # the kept tokens of the first reduction are single patches
    assert not model.blocks[3].fusion.reduction._forward_hooks  # the hooks are removed outside the context
    dropping = timm.create_model('deit_t_tokenfuse', keep_rate=0.5, num_fused_tokens=0, **SMALL).eval()
    with record_token_fusion(dropping) as reductions, torch.no_grad():
        dropping(torch.randn(1, 3, 96, 96))
    first = token_sources(list(reductions.values()), 36)[0]
    assert (first['token'] < 0).sum() == 18 and first['sizes'].sum() == 18


def test_intermediates_map_tokens_back_to_the_patch_grid():
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', **SMALL).eval()
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[2, 3, 11])
        tokens = model.forward_intermediates(x, indices=[3], output_fmt='NLC', intermediates_only=True)
        with record_token_fusion(model) as reductions:
            model(x)
    assert final.shape == (2, model.token_counts()[-1], 192)
    assert [m.shape for m in maps] == [(2, 192, 6, 6)] * 3
    first = token_sources([reductions[3]], 36)[0]['token']  # (B, 36) -> token after block 4
    grid = maps[1].flatten(2).transpose(1, 2)  # (B, 36, C)
    for b in range(2):
        torch.testing.assert_close(grid[b], tokens[0][b, first[b]])


def test_torchscript_and_fx_give_the_eager_outputs_and_hooks_still_record():
    # the hook point is typed for TorchScript; FX keeps the reduction blocks as leaves, hook points inside
    from timm.layers import create_feature_extractor, get_graph_node_names
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', img_size=64, depth=4, reduction_blocks=(1, 2)).eval()
    x = torch.randn(2, 3, 64, 64)
    scripted = torch.jit.script(model)  # before any hook is attached: TorchScript would compile the hooks too
    graph = create_feature_extractor(model, return_nodes=[get_graph_node_names(model)[1][-1]])
    with torch.no_grad(), record_token_fusion(model) as eager, record_token_fusion(graph) as traced:
        expected = model(x)
        torch.testing.assert_close(scripted(x), expected)
        (out,) = graph(x).values()
    torch.testing.assert_close(out, expected)
    assert list(traced) == list(eager) == [1, 2]
    for block in traced:
        assert all(torch.equal(traced[block][k], eager[block][k]) for k in eager[block])


@pytest.mark.parametrize('batch,size', [(1, 224), (2, 160)])
def test_batch_of_one_and_other_image_sizes(batch, size):
    model = timm.create_model('deit_t_tokenfuse', img_size=size).eval()
    with torch.no_grad():
        assert model(torch.randn(batch, 3, size, size)).shape == (batch, 1000)
    dynamic = timm.create_model('deit_t_tokenfuse', dynamic_img_size=True).eval()
    with torch.no_grad():
        assert dynamic(torch.randn(batch, 3, size, size + 32)).shape == (batch, 1000)


def test_low_precision_model_runs_and_stays_finite():
    model = timm.create_model('deit_t_tokenfuse', **SMALL).eval().to(torch.bfloat16)
    with torch.no_grad():
        out = model(torch.randn(2, 3, 96, 96, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_training_backward_and_grad_checkpointing_agree():
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', **SMALL)
    x = torch.randn(2, 3, 96, 96)
    model(x).logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(g.abs().sum() > 0 for n, g in grads.items() if n.startswith('blocks.11'))
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).logsumexp(-1).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6)


def test_reapplying_reconfigures_and_blocks_revert():
    model = timm.create_model('deit_t_tokenfuse', **SMALL)
    apply_token_fusion(model, keep_rate=0.8, reduction_blocks=[5])
    assert [type(b).__name__ for b in model.blocks].count('TokenFusionBlock') == 1
    assert type(model.blocks[3]) is Block and not hasattr(model.blocks[3], 'fusion')
    assert model.blocks[5].fusion.keep_rate == 0.8


def test_clear_errors():
    with pytest.raises(ValueError, match=r'keep_rate must be in \(0, 1\]'):
        timm.create_model('deit_t_tokenfuse', keep_rate=0.)
    with pytest.raises(ValueError, match=r'keep_rate must be in \(0, 1\]'):
        TokenFusion(keep_rate=1.5)
    with pytest.raises(ValueError, match='reduction_blocks must be block indices'):
        timm.create_model('deit_t_tokenfuse', reduction_blocks=(3, 12))
    with pytest.raises(TypeError, match='needs a timm VisionTransformer'):
        apply_token_fusion(timm.create_model('resnet10t'))
    with pytest.raises(TypeError, match='has no class token'):
        apply_token_fusion(VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2,
                                             class_token=False, global_pool='avg'))
    with pytest.raises(TypeError, match='timm Block with timm Attention only'):
        apply_token_fusion(timm.create_model('vit_small_entmax', img_size=32))
    model = timm.create_model('deit_t_tokenfuse', img_size=32)
    with pytest.raises(ValueError, match='attention masks are not supported'):
        model.forward_features(torch.randn(1, 3, 32, 32), attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match='sets block_fn itself'):
        TokenFusionVisionTransformer(block_fn=Block)


def test_fusion_stages_say_which_patches_each_block_keeps_and_fuses():
    from timm_recursive.analysis.token_fusion_maps import fusion_stages
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', **SMALL).eval()
    stages = fusion_stages(model, torch.randn(2, 3, 96, 96))
    assert [s['block'] for s in stages] == [3, 6, 9] and [s['num_kept'] for s in stages] == [26, 21, 18]
    for s in stages:  # every patch is kept or in a cluster; clusters number the fused tokens
        assert ((s['cluster'] >= 0) == s['fused']).all() and s['cluster'].max() == 3, s['block']
    with pytest.raises(TypeError, match='no token fusion block'):
        fusion_stages(timm.create_model('deit_tiny_patch16_224', **SMALL), torch.randn(1, 3, 96, 96))


@pytest.mark.slow
def test_fusion_maps_command_writes_a_png_per_image(tmp_path):
    from timm_recursive.cli.token_fusion_maps import main
    assert main(['--model', 'deit_tiny_patch16_224', '--keep-rate', '0.5', '--out', str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ['token_fusion.json', 'token_fusion_0.png', 'token_fusion_1.png']


def test_cost_adds_the_clustering_of_every_recorded_reduction():
    from timm_recursive.analysis.token_fusion_cost import count_gmacs
    model = timm.create_model('deit_t_tokenfuse', keep_rate=0.5, **SMALL).eval()
    cost = count_gmacs(model, torch.randn(1, 3, 96, 96))
    # 36 patches: 18 fused inputs, then 11 of 18 + 4, then 7 of 11 + 4; each into 4 clusters, width 192
    assert cost['clustering_gmacs'] * 1e9 == pytest.approx(sum(n * n * 192 + n * 192 for n in (18, 11, 7)))
    assert cost['gmacs'] == pytest.approx(cost['counted_gmacs'] + cost['clustering_gmacs'])
    assert all(block.attn.fused_attn for block in model.blocks)  # the fused kernel is on again
    assert not model.blocks[3].fusion.reduction._forward_hooks


MODE_COUNTS = {  # 36 patches, keep 0.5, reductions after blocks 4, 7, 10 (counting from 1)
    'importance': [36, 18 + 1, 10 + 1, 6 + 1],  # the inattentive tokens fused into one (EViT)
    'both': [36, 18 + 4, 11 + 4, 8 + 4],  # the default 4 fused tokens
    'diversity': [36, 18 + 4, 11 + 4, 8 + 4],  # every token clustered into the count of 'both'
}


@pytest.mark.parametrize('mode', sorted(MODE_COUNTS))
def test_modes_token_counts_identity_and_batch_consistency(mode):
    torch.manual_seed(0)
    reference = timm.create_model('deit_tiny_patch16_224', **SMALL).eval()
    model = timm.create_model('deit_t_tokenfuse', mode=mode, keep_rate=1.0, **SMALL).eval()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(3, 3, 96, 96)
    for score in ('cls_query', 'head_mean'):
        apply_token_fusion(model, keep_rate=1.0, mode=mode, importance_score=score)
        _outputs_equal(model, reference, x)  # keep 1.0: the plain DeiT, whatever the mode and score
    apply_token_fusion(model, keep_rate=0.5, mode=mode)
    counts = MODE_COUNTS[mode]
    per_block = [counts[0]] * 3 + [counts[1]] * 3 + [counts[2]] * 3 + [counts[3]] * 3
    assert model.token_counts() == [1 + n for n in per_block]
    seen = []
    hooks = [b.mlp.register_forward_hook(lambda m, i, o: seen.append(o.shape[1])) for b in model.blocks]
    with torch.no_grad(), record_token_fusion(model) as reductions:
        batched = model(x)
        for b in range(3):  # every image is reduced on its own: a batch changes nothing
            torch.testing.assert_close(model(x[b:b + 1])[0], batched[b], rtol=1e-4, atol=1e-5)
    for h in hooks:
        h.remove()
    assert seen[:12] == model.token_counts()
    first = reductions[3]  # the last forward's: the third image alone
    kept = {'importance': 18, 'both': 18, 'diversity': 0}[mode]
    assert first['keep_index'].shape == (1, kept) and first['fuse_index'].shape == (1, 36 - kept)
    assert sorted(first['assignment'][0].unique().tolist()) == list(range(counts[1] - kept))
    with torch.no_grad():
        assert not torch.allclose(batched, reference(x), atol=1e-4)


def test_diversity_clusters_every_patch_and_importance_fuses_the_rest_into_one():
    torch.manual_seed(0)
    B, P, n, C = 2, 1, 12, 4
    x, importance = torch.randn(B, P + n, C), torch.rand(B, n)
    importance_only = TokenFusion(keep_rate=0.5, num_fused_tokens=3, mode='importance')
    out = importance_only(x, importance)
    assert out.shape == (B, P + 6 + 1, C)
    for b in range(B):
        rest = importance[b].topk(n - 6, largest=False).indices
        w = importance[b, rest]
        torch.testing.assert_close(out[b, -1], (w[:, None] * x[b, P + rest]).sum(0) / w.sum())
    diversity = TokenFusion(keep_rate=0.25, num_fused_tokens=2, mode='diversity')
    out, record = _fuse_and_record(diversity, x, importance)
    assert out.shape == (B, P + 3 + 2, C) and diversity.num_outputs(n) == 5
    assert (out[:, 0] == x[:, 0]).all()  # [CLS] untouched
    # each output is the importance-weighted mean of its cluster of the 12 patches
    expected = weighted_cluster_means(x[:, P:].gather(1, record['fuse_index'][..., None].expand(-1, -1, C)),
                                      importance.gather(1, record['fuse_index']), record['assignment'], 5)
    torch.testing.assert_close(out[:, P:], expected)
    # as many clusters as patches: no reduction
    assert TokenFusion(keep_rate=0.9, num_fused_tokens=2, mode='diversity')(x, importance) is x


def test_cls_query_score_is_the_full_width_softmax_of_the_source():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4).eval()
    apply_token_fusion(model, keep_rate=1.0, reduction_blocks=(1,))
    attn = model.blocks[1].attn
    tokens = torch.randn(2, 17, 32)
    with torch.no_grad():
        q, k, _ = attn.qkv(tokens).chunk(3, dim=-1)  # (B, N, d) each: the heads side by side
        expected = (q[:, :1] @ k.transpose(1, 2) / math.sqrt(32)).softmax(dim=-1).squeeze(1)
        for fused in (True, False):
            attn.fused_attn = fused
            out, row = attn.forward_with_cls_row(tokens, 'cls_query')
            torch.testing.assert_close(row, expected)
            torch.testing.assert_close(out, attn.forward_with_cls_row(tokens, 'head_mean')[0])
    with pytest.raises(ValueError, match='importance score must be one of'):
        attn.forward_with_cls_row(tokens, 'mean')
    with pytest.raises(ValueError, match='token fusion mode must be one of'):
        timm.create_model('deit_t_tokenfuse', mode='evit')
    with pytest.raises(ValueError, match='importance score must be one of'):
        TokenFusion(importance_score='max')


def test_one_default_importance_score_the_sources():
    assert DEFAULT_IMPORTANCE_SCORE == 'cls_query'
    for fn in (TokenFusion, apply_token_fusion, TokenFusionVisionTransformer, ClsRowAttention.forward_with_cls_row):
        assert inspect.signature(fn).parameters['importance_score' if fn is not ClsRowAttention.forward_with_cls_row
                                                else 'score'].default == DEFAULT_IMPORTANCE_SCORE, fn
    assert timm.create_model('deit_t_tokenfuse', img_size=32).blocks[3].fusion.importance_score == 'cls_query'


def test_importance_loss_is_the_attention_mass_left_to_fusion():
    torch.manual_seed(0)
    patches = torch.randn(2, 10, 4)
    importance = torch.rand(2, 10).softmax(-1).requires_grad_()
    fusion = TokenFusion(keep_rate=0.3, num_fused_tokens=2)
    _, record = _fuse_and_record(fusion, torch.cat([torch.zeros(2, 1, 4), patches], 1), importance.detach())
    terms = fusion_objective_terms(patches, importance, record)
    kept = importance.detach().gather(1, record['keep_index']).sum(1) / importance.detach().sum(1)
    torch.testing.assert_close(terms['imp'], (1 - kept).mean())
    terms['imp'].backward()
    # lowering an inattentive token's importance lowers the loss; raising a kept one's too
    fused_grad, kept_grad = (importance.grad.gather(1, record[key]) for key in ('fuse_index', 'keep_index'))
    assert (fused_grad > kept_grad.max()).all()
    assert fusion_objective_terms(patches, importance, {}) == {}


def test_diversity_loss_is_within_over_total_cluster_dispersion():
    centres = torch.tensor([[0., 0.], [4., 0.], [0., 4.]])
    assignment = torch.tensor([[0, 0, 1, 1, 2, 2]])
    tight = centres[assignment[0]].unsqueeze(0).clone().requires_grad_()
    record = {'keep_index': torch.zeros(1, 0, dtype=torch.long), 'fuse_index': torch.arange(6)[None],
              'assignment': assignment, 'num_clusters': torch.tensor(3)}
    weights = torch.ones(1, 6)
    assert fusion_objective_terms(tight, weights, record)['div'].item() == pytest.approx(0., abs=1e-6)
    spread = tight.detach() + torch.tensor([[0.5, 0.], [-0.5, 0.], [0.5, 0.], [-0.5, 0.], [0.5, 0.], [-0.5, 0.]])
    spread.requires_grad_()
    div = fusion_objective_terms(spread, weights, record)['div']
    within, total = 6 * 0.25, (spread.detach() - spread.detach().mean(1, keepdim=True)).pow(2).sum()
    assert div.item() == pytest.approx(within / total.item())
    div.backward()  # the gradient pulls every token towards its cluster mean
    assert (spread.grad[0, ::2, 0] > 0).all() and (spread.grad[0, 1::2, 0] < 0).all()
    one_cluster = dict(record, assignment=torch.zeros(1, 6, dtype=torch.long), num_clusters=torch.tensor(1))
    assert 'div' not in fusion_objective_terms(spread, weights, one_cluster)


def test_objective_collects_training_forwards_and_reaches_the_attention():
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', keep_rate=0.5, **SMALL)
    objective = TokenFusionObjective(model, alpha=1.0, beta=0.5)
    x = torch.randn(2, 3, 96, 96)
    model(x)
    loss, terms = objective()
    assert set(terms) == {'imp', 'div'} and 0 < terms['imp'] < 1 and 0 < terms['div'] < 1
    assert loss.item() == pytest.approx(terms['imp'] + 0.5 * terms['div'], rel=1e-5)
    loss.backward()
    assert model.blocks[3].attn.qkv.weight.grad.abs().sum() > 0
    assert objective()[1] == {}  # terms are used once
    model.eval()
    with torch.no_grad():
        model(x)
    assert objective()[1] == {}  # evaluation forwards compute nothing
    copy.deepcopy(model).train()(x)  # an EMA's copy carries the hooks: its training forwards are not the model's
    assert objective()[1] == {}
    objective.remove()
    model.train()
    model(x)
    assert objective()[1] == {} and not model.blocks[3].fusion.reduction._forward_hooks
    with pytest.raises(ValueError, match='has no TokenFusion layer'):
        TokenFusionObjective(timm.create_model('deit_tiny_patch16_224', **SMALL), 1., 1.)
    with pytest.raises(ValueError, match='must be >= 0'):
        TokenFusionObjective(model, -1., 0.)


# a fused ViT small enough for a training run of seconds on 16 px digits: 16 patches, reduction after block 1
TINY_FUSED = ['--model-kwargs', 'img_size=16', 'patch_size=4', 'embed_dim=32', 'depth=2', 'num_heads=2',
              'reduction_blocks=(0,)', "pretrained_cfg_overlay={'input_size':(1,16,16),'crop_pct':1.0}"]
TINY_DATA = ['--dataset', 'digits', '--in-chans', '1', '--max-train-samples', '64', '--max-eval-samples', '40',
             '--batch-size', '16', '--eval-batch-size', '16', '--epochs', '1', '--warmup-epochs', '0', '--hflip', '0',
             '--no-progress']


@pytest.mark.slow
def test_finetune_a_fused_model_from_dense_weights_with_the_objective(tmp_path, capsys):
    from timm_recursive.runs import create_model_from_checkpoint

    from helpers import TINY_RUN, load_script
    train_script = load_script('train')
    dense, fused = str(tmp_path / 'dense'), str(tmp_path / 'fused')
    assert train_script.main(['--model', 'deit_t_tokenfuse', *TINY_FUSED, 'keep_rate=1.0', *TINY_DATA,
                              '--output', dense]) == 0
    # the dense export, reloaded as a fused model (local-dir:), fine-tuned with CE + L_imp + L_div and timm's
    # DeiT recipe pieces (Mixup/CutMix with label smoothing, layer-wise learning-rate decay)
    assert train_script.main(['--model', f'local-dir:{dense}/model', '--pretrained', *TINY_FUSED, 'keep_rate=0.5',
                              '--fusion-imp-weight', '1', '--fusion-div-weight', '1', '--mixup', '0.8', '--cutmix',
                              '1.0', '--label-smoothing', '0.1', '--layer-decay', '0.65', *TINY_DATA,
                              '--output', fused]) == 0
    record = [json.loads(line) for line in open(f'{fused}/metrics.jsonl')][-1]
    assert record['train_fusion_loss'] > 0
    kwargs = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, reduction_blocks=(0,))
    before = create_model_from_checkpoint(dense, **kwargs, keep_rate=0.5)
    after = create_model_from_checkpoint(fused, **kwargs, keep_rate=0.5)
    assert list(after.state_dict()) == list(before.state_dict())
    assert not torch.equal(after.blocks[0].attn.qkv.weight, before.blocks[0].attn.qkv.weight)
    capsys.readouterr()
    assert train_script.main(TINY_RUN + ['--fusion-div-weight', '1', '--output', str(tmp_path / 'recursive')]) == 2
    assert 'has no TokenFusion layer' in capsys.readouterr().err


@pytest.mark.slow
def test_imagenet_evaluation_command_runs_offline_on_an_imagefolder(tmp_path):
    """The README's ImageNet command, with a local DeiT-Ti weight file and a 2-class val/ folder for the Hub and
    ImageNet."""
    from PIL import Image
    from safetensors.torch import save_file

    from helpers import load_script
    for wnid in ('n01440764', 'n01443537'):
        (tmp_path / 'imagenet' / 'val' / wnid).mkdir(parents=True)
        for i in range(2):
            Image.new('RGB', (120, 90), (60 * i, 100, 200)).save(tmp_path / 'imagenet' / 'val' / wnid / f'{i}.JPEG')
    weights = str(tmp_path / 'deit_tiny.safetensors')
    save_file(timm.create_model('deit_tiny_patch16_224', num_classes=2).state_dict(), weights)
    out = str(tmp_path / 'eval.json')
    assert load_script('evaluate').main([
        '--model', 'deit_t_tokenfuse', '--checkpoint', weights, '--model-kwargs', 'num_classes=2', 'keep_rate=0.7',
        'mode=both', '--dataset', str(tmp_path / 'imagenet'), '--split', 'validation', '--json', out]) == 0
    result = json.load(open(out))
    assert result['images'] == 4 and len(result['top1']) == 1


@pytest.mark.parametrize('mode', FUSION_MODES)
def test_every_parameter_gets_gradient_through_the_reductions(mode):
    # blocks after a reduction run on kept and fused tokens only: every weight must still learn
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', keep_rate=0.5, mode=mode, **SMALL).train()
    F.cross_entropy(model(torch.randn(4, 3, 96, 96)), torch.randint(0, 1000, (4,))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name


@pytest.mark.slow  # a search over keep rates: about 4 s
def test_the_keep_rate_for_a_mac_budget_is_the_largest_within_it():
    from timm_recursive.analysis.token_fusion_cost import count_gmacs, keep_rate_for_budget
    image = torch.randn(1, 3, 96, 96)

    def build(keep_rate, fused=2):
        torch.manual_seed(0)
        return timm.create_model('deit_t_tokenfuse', keep_rate=keep_rate, num_fused_tokens=fused, **SMALL)

    dense = count_gmacs(build(1.0).eval(), image)['gmacs']
    budget = 0.7 * dense
    found = keep_rate_for_budget(build, image, budget, tolerance=0.01)
    assert 0 < found['keep_rate'] < 1 and found['gmacs']['gmacs'] <= budget < found['gmacs_above']
    assert keep_rate_for_budget(build, image, 2 * dense)['keep_rate'] == 1.0
    with pytest.raises(ValueError, match='below the cost at keep rate'):
        keep_rate_for_budget(build, image, 0.01 * dense)


def test_the_cost_command_refuses_a_budget_that_is_not_positive(capsys):
    from timm_recursive.cli.token_fusion_cost import main
    with pytest.raises(SystemExit) as exit_:
        main(['--model', 'deit_t_tokenfuse', '--budget-gmacs', '0'])
    assert exit_.value.code == 2 and '--budget-gmacs must be positive' in capsys.readouterr().err


def test_cost_of_a_dynamicvit_model_counts_its_predictors_and_no_clustering():
    from timm_recursive.analysis.token_fusion_cost import count_gmacs
    dynamicvit = timm.create_model('deit_t_tokenfuse', mode='dynamicvit', keep_rate=0.5, **SMALL).eval()
    pruned = timm.create_model('deit_t_tokenfuse', mode='both', num_fused_tokens=0, keep_rate=0.5, **SMALL).eval()
    assert dynamicvit.token_counts() == pruned.token_counts()
    image = torch.randn(1, 3, 96, 96)
    cost, reference = count_gmacs(dynamicvit, image), count_gmacs(pruned, image)
    assert cost['clustering_gmacs'] == 0 and cost['counted_gmacs'] > reference['counted_gmacs']  # the predictors


def test_deit_s_default_lands_at_the_anchors_budget_committed_in_the_study(unfused_attention):
    import json
    import pathlib

    from timm_recursive.analysis.token_fusion_cost import count_gmacs
    from timm_recursive.models.deit_token_fusion import DEIT_S_KEEP_RATE
    budget = json.loads((pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'token_fusion_ablation'
                         / 'results' / 'budget_deit_s.json').read_text())
    found = budget['fused_tokens']['4']
    assert budget['budget_gmacs'] == 3.0 and DEIT_S_KEEP_RATE == round(found['keep_rate'] - 5e-4, 3)  # rounded down
    model = timm.create_model('deit_s_tokenfuse').eval()
    assert model.token_counts() == found['tokens_per_block']
    assert count_gmacs(model, torch.randn(1, 3, 224, 224))['gmacs'] <= 3.0
