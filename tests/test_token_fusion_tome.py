"""Mode ``tome`` of ``apply_token_fusion`` (ToMe's bipartite soft matching) and proportional attention."""
import importlib.util
import json
import math
import pathlib
import warnings

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block, VisionTransformer

import timm_recursive  # noqa: F401
from timm_recursive.analysis.token_fusion_cost import count_gmacs
from timm_recursive.layers import (
    ClsRowAttention,
    SizedBlocks,
    TokenMergingBlock,
    bipartite_soft_matching,
    block_token_counts,
    merge_by_size,
    merge_tokens,
    merging_macs,
    num_merged,
    token_sources,
    tome_r_schedule,
    unmerge_tokens,
)
from timm_recursive.models import apply_token_fusion, record_token_fusion


def _pair(name, **kwargs):
    """A timm model and a copy with the same random weights."""
    torch.manual_seed(0)
    reference = timm.create_model(name, **kwargs).eval()
    model = timm.create_model(name, **kwargs).eval()
    model.load_state_dict(reference.state_dict())
    return model, reference


def _entering_counts(model, x):
    """Tokens each block receives in a forward, read by pre-hooks, and the records of the merges."""
    seen = []
    hooks = [b.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1])) for b in model.blocks]
    try:
        with torch.no_grad(), record_token_fusion(model) as records:
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return out, seen, records


@pytest.mark.slow  # four DeiT-S forwards at 224 px
@pytest.mark.parametrize('name', ['deit_small_patch16_224', 'deit3_small_patch16_224'])  # DeiT-III: LayerScale
def test_r_zero_is_the_unpatched_model_bit_for_bit(name):
    model, reference = _pair(name)
    keys = list(model.state_dict())
    x = torch.randn(2, 3, 224, 224)
    for schedule in (0, [0] * 12):
        apply_token_fusion(model, mode='tome', r=schedule)
        assert isinstance(model.blocks, SizedBlocks) and list(model.state_dict()) == keys
        with torch.no_grad():
            torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


@pytest.mark.slow  # a DeiT-S forward at 224 px
def test_deit_s_r13_token_counts_and_sizes_per_block():
    model, _ = _pair('deit_small_patch16_224')
    apply_token_fusion(model, mode='tome', r=13)
    expected = [197 - 13 * i for i in range(12)]  # 197, 184, 171, ..., 54 entering the 12 blocks
    assert expected[-1] == 54
    assert block_token_counts(model, entering=True) == expected
    assert block_token_counts(model) == [n - 13 for n in expected]  # the MLPs run on the merged tokens
    out, seen, records = _entering_counts(model, torch.randn(2, 3, 224, 224))
    assert seen == expected and out.shape == (2, 1000)
    assert list(records) == list(range(12))
    for block, record in records.items():  # sizes: every token stands for its patches, all counted once
        assert record['size'].shape == (2, expected[block] - 13)
        assert (record['size'].sum(-1) == 197).all() and (record['size'][:, 0] == 1).all()  # [CLS] stays alone


@pytest.mark.slow  # about 2.5 s: three models, r = 0 and r = 3
def test_small_models_r_zero_identity_and_token_counts():
    for name, kwargs in (('deit_tiny_patch16_224', dict(img_size=96)),
                         ('deit_tiny_distilled_patch16_224', dict(img_size=96)),  # [CLS] + distillation token
                         ('vit_small_patch14_reg4_dinov2', dict(img_size=56))):  # LayerScale + 4 registers
        model, reference = _pair(name, **kwargs)
        x = torch.randn(2, 3, kwargs['img_size'], kwargs['img_size'])
        apply_token_fusion(model, mode='tome', r=0)
        with torch.no_grad():
            torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
        apply_token_fusion(model, mode='tome', r=3)
        P, n = model.num_prefix_tokens, model.patch_embed.num_patches
        counts = [P + n]
        for _ in range(len(model.blocks) - 1):
            counts.append(counts[-1] - min(3, (counts[-1] - P) // 2))
        out, seen, records = _entering_counts(model, x)
        assert seen == counts == block_token_counts(model, entering=True), name
        assert all((r['size'].sum(-1) == P + n).all() for r in records.values()), name
        # the prefix tokens ([CLS], distillation, registers) are never merged: first in place, size 1
        for r in records.values():
            assert torch.equal(r['kept_index'][:, :P], torch.arange(P).expand(2, P)) and (r['size'][:, :P] == 1).all()
        with torch.no_grad():
            assert not torch.allclose(out, reference(x), atol=1e-4)


def test_prefix_tokens_are_never_merged_even_when_most_alike():
    # every token the same: the prefix tokens would be the best matches if they could be matched at all
    P, n, C = 5, 16, 8
    x = torch.ones(1, P + n, C)
    out, size, record = merge_tokens(x, torch.ones(1, P + n), x, r=100, num_prefix_tokens=P)
    assert out.shape == (1, P + n // 2, C) and num_merged(100, n) == n // 2  # at most half the non-prefix tokens
    assert torch.equal(record['kept_index'][0, :P], torch.arange(P)) and (size[0, :P] == 1).all()
    assert size.sum() == P + n
    model, _ = _pair('deit_tiny_distilled_patch16_224', img_size=64)
    apply_token_fusion(model, mode='tome', r=100)
    assert block_token_counts(model, entering=True)[:4] == [2 + 16, 2 + 8, 2 + 4, 2 + 2]
    assert block_token_counts(model, entering=True)[-1] == 2 + 1  # one patch token: nothing left to merge


def test_a_merged_token_is_the_size_weighted_mean_of_what_it_merged():
    torch.manual_seed(0)
    C = 4
    b0, b1, b2 = torch.eye(C)[:3]
    # patch tokens A0 B0 A1 B1 A2 B2: A0 and A2 point along B0, A1 along B1, A2 the closest of all, B2 apart
    patches = torch.stack([b0 + 0.3 * b1, b0 * 5, b1 + 0.5 * b0, b1 * 2, b0 + 0.1 * b1, b2 * 3])
    cls = torch.randn(1, C)
    x = torch.cat([cls, patches])[None]
    size = torch.tensor([[1., 2., 3., 1., 4., 5., 6.]])
    # alternation_offset 0: the sets as named above (a prefix token ToMe would not count, as a register)
    out, new_size, record = merge_tokens(x, size, x, r=2, num_prefix_tokens=1, alternation_offset=0)
    # the two most similar joins: A2 -> B0 (cosine 0.995) and A0 -> B0 (0.958); A1 -> B1 (0.894) is left
    assert record['src_index'][0].tolist() == [4, 0] and record['dst_index'][0].tolist() == [1, 1]
    # ToMe's order: the prefix, the unmerged A tokens, then every B token
    assert record['kept_index'][0].tolist() == [0, 3, 2, 4, 6]
    expected_b0 = (2 * patches[0] + 3 * patches[1] + 5 * patches[4]) / (2 + 3 + 5)
    torch.testing.assert_close(out[0, 2], expected_b0)
    assert new_size[0].tolist() == [1., 1., 10., 4., 6.]
    for out_pos, in_pos in ((0, 0), (1, 3), (3, 4), (4, 6)):  # untouched tokens exactly as they were
        assert torch.equal(out[0, out_pos], x[0, in_pos])
    # the same through the lower-level pieces, and a gradient to every input that survives or merged
    src, dst, kept = bipartite_soft_matching(patches[None], 2, alternation_offset=0)
    xg = x.clone().requires_grad_()
    merged, _ = merge_by_size(xg, size, src + 1, dst + 1, torch.cat([torch.zeros(1, 1, dtype=torch.long), kept + 1], 1))
    torch.testing.assert_close(merged, out)
    merged.sum().backward()
    assert (xg.grad.abs().sum(-1) > 0).all()


def test_proportional_attention_with_sizes_one_changes_nothing_and_counts_sizes():
    torch.manual_seed(0)
    attn = ClsRowAttention(32, num_heads=4, qkv_bias=True).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        for fused in (False, True):
            attn.fused_attn = fused
            plain = attn(x)
            torch.testing.assert_close(attn.forward_proportional(x)[0], plain, rtol=0, atol=0)
            torch.testing.assert_close(attn.forward_proportional(x, torch.ones(2, 9))[0], plain,
                                       rtol=0 if not fused else 1e-6, atol=0 if not fused else 1e-6)
            out, row = attn.forward_with_cls_row(x, 'cls_query', torch.ones(2, 9))
            torch.testing.assert_close(row, attn.forward_with_cls_row(x, 'cls_query')[1])
            # a token of size 2 is attended to as two copies of it would be
            doubled = torch.cat([x, x[:, 4:5]], dim=1)
            sizes = torch.ones(2, 9)
            sizes[:, 4] = 2
            torch.testing.assert_close(attn.forward_proportional(x, sizes)[0], attn(doubled)[:, :9],
                                       rtol=1e-5, atol=1e-6)
            for score in ('cls_query', 'head_mean'):
                row = attn.forward_with_cls_row(x, score, sizes)[1]
                row2 = attn.forward_with_cls_row(doubled, score)[1]
                torch.testing.assert_close(row[:, 4], row2[:, 4] + row2[:, 9])


@pytest.mark.parametrize('mode', ['both', 'importance', 'diversity'])
def test_proportional_attention_in_the_sources_modes(mode):
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', mode=mode, img_size=96, keep_rate=1.0, proportional_attention=True)
    plain = timm.create_model('deit_t_tokenfuse', mode=mode, img_size=96, keep_rate=1.0).eval()
    plain.load_state_dict(model.state_dict())
    model.eval()
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():  # keep rate 1: all sizes 1, so the log-size bias is 0 everywhere
        torch.testing.assert_close(model(x), plain(x), rtol=1e-5, atol=1e-5)
    apply_token_fusion(model, keep_rate=0.5, mode=mode, proportional_attention=True)
    apply_token_fusion(plain, keep_rate=0.5, mode=mode)
    assert model.token_counts() == plain.token_counts() and isinstance(model.blocks, SizedBlocks)
    assert type(plain.blocks) is torch.nn.Sequential  # off by default: the source's model as before
    with torch.no_grad():
        assert not torch.allclose(model(x), plain(x), atol=1e-4)
    model.train()
    F.cross_entropy(model(x), torch.tensor([1, 2])).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tome_schedules():
    assert tome_r_schedule(13, 12) == [13] * 12
    assert tome_r_schedule(13, 12, 'decreasing') == [26, 23, 21, 18, 16, 14, 11, 9, 7, 4, 2, 0]
    assert tome_r_schedule([1, 2, 3], 3) == [1, 2, 3]
    model = timm.create_model('deit_s_tokenfuse', mode='tome', r=8, r_schedule='decreasing')
    assert [b.fusion.r for b in model.blocks] == tome_r_schedule(8, 12, 'decreasing')
    assert model.token_counts(entering=True)[:3] == [197, 181, 167]  # 16 then 2 * 8 * 10 // 11 = 14 merged
    # proportional attention from the first block after a merge on
    assert [b.proportional for b in model.blocks] == [False] + [True] * 11
    late = timm.create_model('deit_t_tokenfuse', mode='tome', r=[0, 0, 4, 0], depth=4, img_size=64)
    assert [b.proportional for b in late.blocks] == [False, False, False, True]
    assert not any(b.proportional for b in timm.create_model('deit_t_tokenfuse', mode='tome', r=4, depth=2,
                                                             proportional_attention=False).blocks)


def test_training_step_with_tome_reaches_every_parameter():
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', mode='tome', r=4, img_size=96, drop_path_rate=0.1,
                              num_classes=10).train()
    F.cross_entropy(model(torch.randn(4, 3, 96, 96)), torch.randint(0, 10, (4,))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name
    assert list(model.state_dict()) == list(timm.create_model('deit_tiny_patch16_224', img_size=96,
                                                              num_classes=10).state_dict())


def test_clear_errors():
    with pytest.raises(ValueError, match="mode='tome' needs r"):
        apply_token_fusion(timm.create_model('deit_tiny_patch16_224', img_size=32), mode='tome')
    with pytest.raises(ValueError, match="r .* is a setting of mode='tome'"):
        timm.create_model('deit_t_tokenfuse', r=4)
    with pytest.raises(ValueError, match='r must be >= 0'):
        timm.create_model('deit_t_tokenfuse', mode='tome', r=-1)
    with pytest.raises(ValueError, match='one count per block'):
        timm.create_model('deit_t_tokenfuse', mode='tome', r=[1, 2])
    with pytest.raises(ValueError, match='r_schedule must be one of'):
        timm.create_model('deit_t_tokenfuse', mode='tome', r=2, r_schedule='increasing')
    with pytest.raises(TypeError, match='needs a timm VisionTransformer'):
        apply_token_fusion(timm.create_model('resnet10t'), mode='tome', r=2)
    with pytest.raises(TypeError, match='timm Block with timm Attention only'):
        apply_token_fusion(timm.create_model('vit_small_entmax', img_size=32), mode='tome', r=2)
    gap = VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2, class_token=False,
                            global_pool='avg')
    with pytest.raises(ValueError, match="global_pool='avg' pools over the tokens: unmerge_output=False"):
        apply_token_fusion(gap, mode='tome', r=1, unmerge_output=False)
    with pytest.raises(ValueError, match="unmerge_output is a setting of mode='tome'"):
        apply_token_fusion(gap, keep_rate=0.5, unmerge_output=True)
    with pytest.raises(ValueError, match='mode dynamicvit fuses nothing'):
        timm.create_model('deit_t_tokenfuse', mode='dynamicvit', proportional_attention=True)
    model = timm.create_model('deit_t_tokenfuse', mode='tome', r=2, img_size=32)
    with pytest.raises(RuntimeError, match='carries every token.s size from block to block'):
        model.blocks[1](torch.randn(1, 5, 192))  # not the tensor block 0 returned: its sizes are unknown
    with pytest.raises(ValueError, match='attention masks are not supported'):
        timm.create_model('deit_t_tokenfuse', mode='tome', r=2, img_size=32).forward_features(
            torch.randn(1, 3, 32, 32), attn_mask=torch.ones(5, 5, dtype=torch.bool))


def test_reapplying_moves_between_tome_and_the_other_modes():
    model = timm.create_model('deit_t_tokenfuse', mode='tome', r=2, img_size=64)
    apply_token_fusion(model, keep_rate=0.5)
    assert type(model.blocks) is torch.nn.Sequential
    assert [type(b).__name__ for b in model.blocks].count('TokenFusionBlock') == 3
    assert type(model.blocks[0]) is Block and not hasattr(model.blocks[0], 'proportional')
    apply_token_fusion(model, mode='tome', r=1)
    assert all(type(b) is TokenMergingBlock and b.fusion.r == 1 for b in model.blocks)


def test_cost_counts_the_merged_tokens_and_the_merges():
    from timm_recursive.analysis.token_fusion_cost import count_gmacs, tokens_per_block
    torch.manual_seed(0)
    dense = timm.create_model('deit_tiny_patch16_224', img_size=96).eval()
    tome = timm.create_model('deit_t_tokenfuse', mode='tome', r=4, img_size=96).eval()
    image = torch.randn(1, 3, 96, 96)
    cost, reference = count_gmacs(tome, image), count_gmacs(dense, image)
    merges = [min(4, (n - 1) // 2) for n in tome.token_counts(entering=True)]
    assert cost['merging_gmacs'] * 1e9 == pytest.approx(sum(merging_macs(r, 192) for r in merges))
    assert cost['gmacs'] == pytest.approx(cost['counted_gmacs'] + cost['merging_gmacs'])
    assert tokens_per_block(tome, image) == tome.token_counts(entering=True)
    assert tokens_per_block(dense, image) == [37] * 12 and reference['merging_gmacs'] == 0
    assert cost['counted_gmacs'] < reference['counted_gmacs']


def test_the_tome_schedule_for_a_mac_budget_has_the_fewest_merges_within_it():
    from timm_recursive.analysis.token_fusion_cost import count_gmacs, tome_r_for_budget, tome_schedule
    assert [tome_schedule(m, 4) for m in (0, 1, 3, 4, 9)] == [
        [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [3, 2, 2, 2]]
    image = torch.randn(1, 3, 64, 64)
    built = []

    def build(r):
        built.append(r)
        torch.manual_seed(0)
        return timm.create_model('deit_t_tokenfuse', mode='tome', r=r, img_size=64, depth=4, num_classes=10)

    dense = count_gmacs(build(0).eval(), image)['gmacs']
    budget = 0.7 * dense
    found = tome_r_for_budget(build, image, budget, depth=4, max_r=8)
    assert found['gmacs']['gmacs'] <= budget < found['gmacs_fewer_merges']
    merges = sum(found['r'])
    assert found['r'] == tome_schedule(merges, 4) and 0 < merges < 32
    assert count_gmacs(build(tome_schedule(merges - 1, 4)).eval(), image)['gmacs'] > budget
    assert len(built) < 12  # bisection, not a scan of the 33 schedules
    assert tome_r_for_budget(build, image, 2 * dense, depth=4, max_r=8)['r'] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match='below the cost at r=8'):
        tome_r_for_budget(build, image, 0.01 * dense, depth=4, max_r=8)


# --- export and compile, as tests/test_export.py does for the other modes -------------------------------------

def _tiny_tome():
    torch.manual_seed(0)
    model = timm.create_model('deit_t_tokenfuse', mode='tome', r=[3, 2, 2, 1], num_classes=10, img_size=64,
                              depth=4).eval()
    return model, torch.randn(2, 3, 64, 64)


@pytest.mark.slow
def test_tome_compiles_as_one_graph_with_the_eager_output():
    model, x = _tiny_tome()
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(torch.compile(model, backend='eager', fullgraph=True)(x), expected,
                                   rtol=1e-5, atol=1e-5)
    model.train()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


@pytest.mark.slow
def test_tome_torch_export_matches_eager_on_new_inputs():
    model, x = _tiny_tome()
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        for y in (x, torch.randn_like(x)):  # a frozen merge would give the first input's answer
            torch.testing.assert_close(exported.module()(y), model(y), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('dynamo', [False, True])
def test_tome_onnx_export_matches_pytorch_in_onnxruntime(dynamo, tmp_path):
    ort = pytest.importorskip('onnxruntime')
    if dynamo:
        pytest.importorskip('onnxscript')
    model, x = _tiny_tome()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(model, (x,), str(tmp_path / 'tome.onnx'), dynamo=dynamo, input_names=['pixel_values'])
    session = ort.InferenceSession(str(tmp_path / 'tome.onnx'), providers=['CPUExecutionProvider'])
    for y in (x, torch.randn_like(x)):
        (actual,) = session.run(None, {'pixel_values': y.numpy()})
        with torch.no_grad():
            assert abs(actual - model(y).numpy()).max() < 1e-5


@pytest.mark.slow
def test_train_command_fine_tunes_with_tome(tmp_path):
    from timm_recursive.runs import create_model_from_checkpoint

    from helpers import load_script
    run = str(tmp_path / 'tome')
    kwargs = ['img_size=16', 'patch_size=4', 'embed_dim=32', 'depth=2', 'num_heads=2', 'mode=tome', 'r=[3,2]',
              "pretrained_cfg_overlay={'input_size':(1,16,16),'crop_pct':1.0}"]
    assert load_script('train').main([
        '--model', 'deit_t_tokenfuse', '--model-kwargs', *kwargs, '--drop-path', '0.1', '--grad-checkpointing',
        '--dataset', 'digits', '--in-chans', '1', '--max-train-samples', '64', '--max-eval-samples', '40',
        '--batch-size', '16', '--eval-batch-size', '16', '--epochs', '1', '--warmup-epochs', '0', '--hflip', '0',
        '--no-progress', '--output', run]) == 0
    record = [json.loads(line) for line in open(f'{run}/metrics.jsonl')][-1]
    assert math.isfinite(record['train_loss'])
    model = create_model_from_checkpoint(run)
    assert [b.fusion.r for b in model.blocks] == [3, 2] and model.token_counts(entering=True) == [17, 14]


def test_the_sources_modes_keep_the_distillation_token_of_a_distilled_deit():
    model, reference = _pair('deit_tiny_distilled_patch16_224', img_size=64)  # [CLS] + distillation token
    x = torch.randn(2, 3, 64, 64)
    apply_token_fusion(model, keep_rate=1.0, reduction_blocks=(1, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    for proportional in (False, True):
        apply_token_fusion(model, keep_rate=0.5, reduction_blocks=(1, 5), proportional_attention=proportional)
        assert block_token_counts(model, entering=True)[5:7] == [2 + 8 + 4, 2 + 6 + 4]  # 16 -> 8 + 4 -> 6 + 4
        out, seen, records = _entering_counts(model, x)
        assert seen == block_token_counts(model, entering=True) and out.shape == (2, 1000)


@pytest.mark.parametrize('mode', ['tome', 'both'])
def test_blocks_called_one_at_a_time_carry_the_sizes_intermediates_and_checkpointing(mode):
    """timm's forward_intermediates and gradient checkpointing call the blocks one by one: the sizes go with the
    tensors, so both give what the model's forward gives (tome, and a source mode with proportional attention)."""
    torch.manual_seed(0)
    kwargs = dict(r=3) if mode == 'tome' else dict(keep_rate=0.5, proportional_attention=True)
    model = timm.create_model('deit_t_tokenfuse', mode=mode, img_size=64, num_classes=10, **kwargs)
    x = torch.randn(2, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        tokens = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        size, source = torch.ones(tokens.shape[:2]), None
        expected = []
        for block in model.blocks:  # the model's path: sizes (and tome's sources) passed from block to block
            tokens, size, source = block(tokens, size=size, source=source)
            expected.append(tokens[:, 1:])
        final, nlc = model.forward_intermediates(x, output_fmt='NLC')
        torch.testing.assert_close(final, model.norm(tokens))
        torch.testing.assert_close(model.forward_head(final), model(x))
        for got, want in zip(nlc, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        with record_token_fusion(model) as records:
            maps = model.forward_intermediates(x, indices=[11], intermediates_only=True)  # NCHW: 4 x 4 patches
    stage = token_sources(list(records.values()), 16)[-1]
    grid = maps[0].flatten(2).transpose(1, 2)
    for b in range(2):
        torch.testing.assert_close(grid[b], expected[11][b, stage['token'][b]])
    if mode == 'tome':
        assert torch.equal(stage['sizes'].float(), list(records.values())[-1]['size'][:, 1:])  # the last merge
    model.train()  # gradient checkpointing: the same gradients
    torch.manual_seed(1)
    F.cross_entropy(model(x), torch.tensor([1, 2])).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    torch.manual_seed(1)
    F.cross_entropy(model(x), torch.tensor([1, 2])).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6)


# ToMe's own outputs: tests/data/tome_golden/make_golden.py computed them from the authors' code
GOLDEN_DIR = pathlib.Path(__file__).parent / 'data' / 'tome_golden'


def _golden_script():
    spec = importlib.util.spec_from_file_location('make_golden', GOLDEN_DIR / 'make_golden.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('key', ['deit_s', 'deit3_s', 'deit_s_distilled', 'vit_s_reg4', 'vit_s_avg'])
def test_tome_gives_the_original_implementations_outputs(key):
    golden_script = _golden_script()
    golden = json.loads((GOLDEN_DIR / 'golden.json').read_text())['logits'][key]
    model = golden_script.build_model(key)
    x = golden_script.images()
    for name, r in golden_script.R.items():
        apply_token_fusion(model, mode='tome', r=r,
                           proportional_attention=golden_script.PROPORTIONAL_ATTENTION.get(key, True))
        with torch.no_grad():
            # the golden logits are rounded to 1e-6; float32 noise is about 1e-6 (the orders differed by 1e-2)
            torch.testing.assert_close(model(x), torch.tensor(golden[name]), rtol=0, atol=1e-5)


def test_the_sets_alternate_as_tome_counts_them_from_cls_and_distillation_tokens():
    torch.manual_seed(0)
    metric = torch.randn(2, 10, 8)
    for offset, a_parity in ((0, 0), (1, 1), (2, 0)):  # no prefix, [CLS], [CLS] and distillation token
        src, dst, kept = bipartite_soft_matching(metric, 3, offset)
        assert (src % 2 == a_parity).all() and (dst % 2 != a_parity).all()
        b_tokens = torch.arange(1 - a_parity, 10, 2)
        assert torch.equal(kept[:, -len(b_tokens):], b_tokens.expand(2, -1))  # every B token, last, in order
        unmerged_a = kept[:, :-len(b_tokens)]
        assert torch.equal(unmerged_a, unmerged_a.sort(dim=1).values)
    # without [CLS] ToMe leaves the unmerged A tokens in decreasing similarity
    src, dst, kept = bipartite_soft_matching(metric, 1, 0, sort_unmerged=False)
    a = F.normalize(metric, dim=-1)
    best = (a[:, 0::2] @ a[:, 1::2].transpose(1, 2)).amax(-1)
    assert torch.equal(kept[:, :4] // 2, best.argsort(dim=1, descending=True)[:, 1:])
    # registers are protected but not counted: with [CLS] and 4 registers the first patch token is in B
    model = apply_token_fusion(VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2,
                                                 reg_tokens=4), mode='tome', r=2)
    assert model.blocks[0].fusion.alternation_offset == 1 and model.num_prefix_tokens == 5


def _small(name, **kwargs):
    return dict(img_size=32, patch_size=8, embed_dim=32, num_heads=2, depth=3, num_classes=5, **kwargs)


@pytest.mark.parametrize('r', [0, 3])
def test_unmerged_output_gives_every_patch_its_merged_tokens_feature(r):
    """``unmerge_output=True``: ``forward_features`` returns every patch (dense features); r = 0: the plain model's."""
    model, reference = _pair('deit_tiny_patch16_224', **_small(''))
    x = torch.randn(2, 3, 32, 32)
    apply_token_fusion(model, mode='tome', r=r, unmerge_output=True)
    merged, _ = _pair('deit_tiny_patch16_224', **_small(''))
    apply_token_fusion(merged, mode='tome', r=r)
    with torch.no_grad(), record_token_fusion(merged) as records:
        dense, tokens = model.forward_features(x), merged.forward_features(x)
    assert dense.shape == (2, 1 + 16, 32)
    if r == 0:
        assert torch.equal(dense, reference.forward_features(x))
        return
    token = token_sources(list(records.values()), 16)[-1]['token']
    assert tokens.shape[1] == 1 + 16 - 3 * r and len(token.unique()) == 16 - 3 * r  # 16 patches, 3 merges of r
    torch.testing.assert_close(dense, unmerge_tokens(tokens, token, 1), rtol=0, atol=0)
    for b in range(2):
        for t in token[b].unique():
            group = dense[b, 1:][token[b] == t]
            assert torch.equal(group, group[:1].expand_as(group))  # a merged group's patches: one feature


# docs/token_fusion.md's table of timm's ViT families: (row, model name, small kwargs) -> merges, or refuses
FAMILIES_MERGED = {
    'ViT': ('vit_small_patch16_224', {}),
    'ViT, LayerScale (DeiT-III)': ('deit3_small_patch16_224', {'init_values': 0.1}),
    'ViT, q/k norm': ('vit_small_patch16_224', {'qk_norm': True}),
    'ViT, registers': ('vit_small_patch14_reg4_dinov2', {'init_values': 0.1}),
    'ViT, registers, no [CLS], average pooling': ('vit_medium_patch16_reg4_gap_256', {'init_values': 0.1}),
    'distilled DeiT': ('deit_small_distilled_patch16_224', {}),
    'average pooling (MAE)': ('vit_small_patch16_224', {'global_pool': 'avg'}),
    'SigLIP, attention pooling': ('vit_base_patch16_siglip_224', {}),
}
FAMILIES_REFUSED = {
    'EVA, rotary positions': ('eva02_tiny_patch14_224', 'rotates every token by its patch position'),
    'ViT with rotary positions': ('vit_medium_patch16_rope_reg1_gap_256', 'rotates every token by its patch position'),
    'NaFlex': ('naflexvit_base_patch16_gap', 'packs images of different sizes with a patch mask'),
}


@pytest.mark.parametrize('row', list(FAMILIES_MERGED))
def test_every_timm_vit_family_merges(row):
    name, kwargs = FAMILIES_MERGED[row]
    model, reference = _pair(name, **_small('', **kwargs))
    x = torch.randn(2, 3, 32, 32)
    apply_token_fusion(model, mode='tome', r=0)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-6, atol=1e-6)  # r = 0: the plain model
    apply_token_fusion(model, mode='tome', r=3)
    out, seen, records = _entering_counts(model, x)
    P = model.num_prefix_tokens
    assert seen == [P + 16, P + 13, P + 10] == block_token_counts(model, entering=True)
    assert all(torch.equal(r['kept_index'][:, :P], torch.arange(P).expand(2, P)) for r in records.values())
    assert out.shape == (2, 5) and torch.isfinite(out).all() and not torch.allclose(out, reference(x), atol=1e-4)
    # the cost benchmark counts every family (SigLIP's pool takes a parameter as its input) and leaves it trainable
    assert 0 < count_gmacs(model, x[:1])['gmacs'] < count_gmacs(reference, x[:1])['gmacs']
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize('row', list(FAMILIES_REFUSED))
def test_every_timm_vit_family_that_cannot_merge_refuses_in_one_line(row):
    name, why = FAMILIES_REFUSED[row]
    model = timm.create_model(name, **_small(''))
    with pytest.raises(TypeError, match=why) as error:
        apply_token_fusion(model, mode='tome', r=2)
    assert '\n' not in str(error.value)


def test_merge_maps_draw_each_group_in_its_own_colour():
    from timm_recursive.analysis.token_fusion_maps import draw_merge_groups, merge_groups
    model, _ = _pair('deit_tiny_patch16_224', **_small(''))
    apply_token_fusion(model, mode='tome', r=3)
    x = torch.randn(2, 3, 32, 32)
    groups = merge_groups(model, x)
    assert groups.shape == (2, 16) and all(len(g.unique()) == 16 - 9 for g in groups)  # 3 blocks merge 3 each
    with record_token_fusion(model) as records:
        model(x)
    assert torch.equal(groups, token_sources(list(records.values()), 16)[-1]['token'])
    # two groups on a 2 x 2 grid: the left column and the right one, 8 x 8 pixels
    picture = torch.rand(8, 8, 3, dtype=torch.float64).numpy()
    drawn = draw_merge_groups(picture, torch.tensor([[0, 5], [0, 5]]).numpy())
    left, right = drawn[1:-1, :3], drawn[1:-1, 5:]  # inside each group: its mean colour
    assert (abs(left - picture[:, :4].reshape(-1, 3).mean(0)) < 1e-9).all()
    assert (abs(right - picture[:, 4:].reshape(-1, 3).mean(0)) < 1e-9).all()
    assert (drawn[:, 3] == drawn[0, 3]).all() and (drawn[:, 4] == drawn[0, 4]).all()  # the outlines, one colour each
    assert not (drawn[0, 3] == drawn[0, 4]).all()
    with pytest.raises(TypeError, match='does not merge tokens'):
        merge_groups(timm.create_model('deit_tiny_patch16_224', **_small('')), x)


@pytest.mark.slow
def test_merge_maps_command_writes_a_png_per_image(tmp_path):
    from timm_recursive.cli.token_fusion_maps import main
    assert main(['--model', 'deit_tiny_patch16_224', '--mode', 'tome', '--r', '8', '--out', str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'token_merging.json', 'token_merging_0.png', 'token_merging_1.png']
    assert json.loads((tmp_path / 'token_merging.json').read_text())[0]['groups'] == 196 - 8 * 12
