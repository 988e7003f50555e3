"""Dynamic Sparse Attention and Mixture-of-Experts layers against straightforward references."""
import pytest
import torch
import torch.nn.functional as F

from timm_recursive.layers import (
    DynamicSparseAttention,
    MixtureOfExperts,
    attention_map,
    expert_counts,
    load_balancing_loss,
    router_z_loss,
    sparse_attention_sparsity,
)


def _qkv(attn: DynamicSparseAttention, x: torch.Tensor):
    """Queries (B, H, L, D) and the shared key/value head (B, L, D) from the layer's weights."""
    B, L, C = x.shape
    qkv = F.linear(x, attn.qkv.weight, attn.qkv.bias)
    q, k, v = qkv.split([C, attn.head_dim, attn.head_dim], dim=-1)
    return q.reshape(B, L, attn.num_heads, attn.head_dim).transpose(1, 2), k, v


def _reference_indexer_topk(attn: DynamicSparseAttention, x: torch.Tensor) -> torch.Tensor:
    q, k, _ = _qkv(attn, x)
    index_q = q.mean(dim=1) @ attn.index_q.weight.T
    index_k = k @ attn.index_k.weight.T
    scores = index_q @ index_k.transpose(-2, -1)
    return scores.topk(min(attn.topk, x.shape[1]), dim=-1).indices


def _reference_sparse_attention(attn: DynamicSparseAttention, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Per-query loop: softmax attention of every head over the given key indices only."""
    B, L, C = x.shape
    q, k, v = _qkv(attn, x)
    out = torch.zeros(B, attn.num_heads, L, attn.head_dim)
    for b in range(B):
        for i in range(L):
            sel = keys[b, i]
            logits = q[b, :, i] @ k[b, sel].T * attn.head_dim ** -0.5  # H, k
            out[b, :, i] = logits.softmax(-1) @ v[b, sel]
    return attn.proj(out.transpose(1, 2).reshape(B, L, C))


@pytest.mark.parametrize('seq_len', [1, 3, 6])
def test_dsa_equals_dense_multi_query_attention_up_to_k_tokens(seq_len):
    torch.manual_seed(0)
    attn = DynamicSparseAttention(64, num_heads=4, topk=6).eval()
    x = torch.randn(2, seq_len, 64)
    q, k, v = _qkv(attn, x)
    dense = F.scaled_dot_product_attention(q, k.unsqueeze(1), v.unsqueeze(1))
    expected = attn.proj(dense.transpose(1, 2).reshape(2, seq_len, 64))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


def test_dsa_attends_exactly_to_the_indexer_top_k():
    torch.manual_seed(0)
    attn = DynamicSparseAttention(64, num_heads=4, topk=3).eval()
    x = torch.randn(2, 9, 64)
    chosen = attn.select(x)
    assert chosen.shape == (2, 9, 3)
    torch.testing.assert_close(chosen, _reference_indexer_topk(attn, x))
    torch.testing.assert_close(attn(x), _reference_sparse_attention(attn, x, chosen), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('seq_len', [4, 9])
def test_dsa_hook_points_show_the_attention_it_applies(seq_len):
    torch.manual_seed(0)
    attn = DynamicSparseAttention(64, num_heads=4, topk=6).eval()
    x = torch.randn(2, seq_len, 64)
    seen = {}
    attn.key_select.register_forward_hook(lambda module, inputs, output: seen.setdefault('keys', inputs[0]))
    attn.attn_drop.register_forward_hook(lambda module, inputs, output: seen.setdefault('probs', inputs[0]))
    attn(x)
    n = min(6, seq_len)
    assert seen['keys'].shape == (2, seq_len, n) and seen['probs'].shape == (2, seq_len, 4, n)
    chosen = attn.select(x)
    torch.testing.assert_close(seen['keys'].sort(-1).values, chosen.sort(-1).values)
    # the full map: each head's softmax over the selected keys, zero elsewhere
    q, k, _ = _qkv(attn, x)
    logits = (q @ k.unsqueeze(1).transpose(-2, -1)) * attn.head_dim ** -0.5  # (B, H, L, L)
    keep = torch.zeros(2, seq_len, seq_len, dtype=torch.bool).scatter(-1, chosen, True)
    expected = logits.masked_fill(~keep.unsqueeze(1), float('-inf')).softmax(-1).transpose(1, 2)
    torch.testing.assert_close(attention_map(seen['probs'], seen['keys']), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='do not match'):
        attention_map(seen['probs'], seen['keys'][..., :1])


def test_dsa_values_reach_only_the_queries_that_selected_them():
    torch.manual_seed(0)
    attn = DynamicSparseAttention(32, num_heads=2, topk=2).eval()
    x = torch.randn(1, 7, 32)
    captured = {}

    def keep_projection(module, inputs, output):
        output.retain_grad()
        captured['qkv'] = output

    attn.qkv.register_forward_hook(keep_projection)
    query = 3
    attn(x)[0, query].sum().backward()
    value_grad = captured['qkv'].grad[0, :, -attn.head_dim:]  # the shared value head of every token
    chosen = set(attn.select(x)[0, query].tolist())
    for token in range(7):
        assert bool(value_grad[token].abs().sum() > 0) == (token in chosen), token


def test_dsa_indexer_receives_gradient_in_dense_and_sparse_regimes():
    torch.manual_seed(0)
    for seq_len in (4, 12):
        attn = DynamicSparseAttention(32, num_heads=2, topk=6)
        attn(torch.randn(2, seq_len, 32)).square().sum().backward()
        for p in (attn.index_q.weight, attn.index_k.weight):
            assert p.grad is not None and torch.count_nonzero(p.grad) > 0, seq_len


def test_dsa_gradients_stay_finite_and_bounded_for_extreme_indexer_scores():
    # a sigmoid(s) / stop_grad(sigmoid(s)) gate divides by an underflowed sigmoid here and gives NaN;
    # a gradient of (1 - sigmoid(s)) never lets decided scores rest: they ran away during training
    torch.manual_seed(0)
    for seq_len in (4, 12):
        attn = DynamicSparseAttention(32, num_heads=2, topk=6)
        with torch.no_grad():
            attn.index_q.weight.mul_(300.)
            attn.index_k.weight.mul_(300.)
        x = torch.randn(2, seq_len, 32, requires_grad=True)
        assert attn._project(x)[2].abs().max() > 200  # sigmoid(-200) underflows to 0 in float32
        out = attn(x)
        out.square().sum().backward()
        assert torch.isfinite(out).all()
        for p in [x] + list(attn.parameters()):
            assert torch.isfinite(p.grad).all(), seq_len
        # the decided (saturated) scores no longer move: the indexer's gradient all but vanishes
        assert attn.index_q.weight.grad.abs().max() < 1e-3 * attn.qkv.weight.grad.abs().max()


def test_sparsity_formula():
    assert sparse_attention_sparsity(6, 6) == 0.
    assert sparse_attention_sparsity(12, 6) == 0.5
    assert sparse_attention_sparsity(3, 2) == pytest.approx(1 / 3)


def test_dsa_rejects_bad_topk():
    for topk in (0, -1, 1.5):
        with pytest.raises(ValueError, match='topk'):
            DynamicSparseAttention(32, num_heads=2, topk=topk)


def _reference_moe(moe: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax router, top-m experts, renormalised weights, weighted expert sum."""
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        probs = (moe.router.weight @ x[n]).softmax(-1)
        top = probs.topk(moe.experts_per_token)
        weights = top.values / top.values.sum()
        for w, e in zip(weights, top.indices):
            out[n] += w * moe.experts[int(e)](x[n:n + 1])[0]
    return out


@pytest.mark.parametrize('num_experts,experts_per_token', [(4, 2), (4, 1), (3, 3)])
def test_moe_matches_reference_routing(num_experts, experts_per_token):
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, 24, num_experts=num_experts, experts_per_token=experts_per_token).eval()
    x = torch.randn(3, 5, 16)
    out, aux = moe(x)
    assert out.shape == x.shape and aux.shape == ()
    torch.testing.assert_close(out, _reference_moe(moe, x.reshape(-1, 16)).reshape(3, 5, 16), rtol=1e-5, atol=1e-6)


def test_moe_computes_each_expert_only_on_its_tokens():
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, num_experts=4, experts_per_token=2)
    x = torch.randn(40, 16)
    seen = {}
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda m, inp, out, e=e: seen.__setitem__(e, inp[0].shape[0]))
    moe(x)
    _, _, _, experts = moe.route(x)
    assert seen == {e: int((experts == e).sum()) for e in range(4)}
    assert sum(seen.values()) == 40 * 2


def test_moe_every_expert_and_router_get_gradient():
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, num_experts=4, experts_per_token=2)
    out, aux = moe(torch.randn(64, 16))
    (out.square().mean() + aux).backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name


def test_load_balancing_loss_is_one_when_uniform():
    num_experts, tokens = 4, 8
    probs = torch.full((tokens, num_experts), 1 / num_experts)
    experts = torch.tensor([[0, 1], [2, 3]] * (tokens // 2))
    assert load_balancing_loss(probs, experts, num_experts).item() == pytest.approx(1.0)
    # collapsed routing with a confident router is penalised
    collapsed = torch.zeros(tokens, num_experts)
    collapsed[:, :2] = 0.5
    assert load_balancing_loss(collapsed, torch.tensor([[0, 1]] * tokens), num_experts).item() == pytest.approx(2.0)


def test_expert_counts_and_z_loss():
    assert expert_counts(torch.tensor([[0, 2], [2, 3]]), 5).tolist() == [1, 0, 2, 1, 0]
    logits = torch.zeros(3, 4)
    assert router_z_loss(logits).item() == pytest.approx(torch.log(torch.tensor(4.)).item() ** 2)
    moe = MixtureOfExperts(8, num_experts=4, z_loss_weight=0.5)
    moe_no_z = MixtureOfExperts(8, num_experts=4)
    moe_no_z.load_state_dict(moe.state_dict())
    x = torch.randn(10, 8)
    logits = moe.router(x)
    assert moe(x)[1].item() == pytest.approx(moe_no_z(x)[1].item() + 0.5 * router_z_loss(logits).item(), rel=1e-5)


def test_moe_rejects_bad_routing_arguments():
    with pytest.raises(ValueError, match='experts_per_token'):
        MixtureOfExperts(8, num_experts=2, experts_per_token=3)
    with pytest.raises(ValueError, match='experts_per_token'):
        MixtureOfExperts(8, num_experts=2, experts_per_token=0)
    with pytest.raises(ValueError, match='num_experts'):
        MixtureOfExperts(8, num_experts=0)


def test_moe_runs_on_meta_device():
    moe = MixtureOfExperts(8, num_experts=4, device='meta')
    out, aux = moe(torch.randn(2, 3, 8, device='meta'))
    assert out.shape == (2, 3, 8) and out.is_meta and aux.shape == ()
