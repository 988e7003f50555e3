"""Mode ``dynamicvit`` of the token-fusion DeiTs (DynamicViT, Rao et al. 2021); the other modes unchanged."""
import pytest
import timm
import torch

import timm_recursive  # noqa: F401 (registers the models)
from timm_recursive.layers import (
    KeepMaskedBlocks,
    TokenFusionBlock,
    TokenFusionObjective,
    fusion_output_counts,
    gumbel_keep_mask,
    keep_mask_softmax,
    num_kept,
    ratio_loss,
    record_token_fusion,
)


def _model(mode, **kwargs):
    torch.manual_seed(0)
    return timm.create_model('deit_t_tokenfuse', mode=mode, img_size=96, num_classes=10, **kwargs)


def _images(batch=2):
    return torch.randn(batch, 3, 96, 96, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize('mode, output_sum, output_abs_sum', [
    # fixed-seed outputs of main before mode dynamicvit existed (commit 06c871a)
    ('both', 0.8022521138191223, 3.078921064734459),
    ('importance', 0.780935674905777, 3.109855055809021),
    ('diversity', 0.9939142316579819, 3.1725714653730392),
])
def test_existing_modes_unchanged(mode, output_sum, output_abs_sum):
    model = _model(mode).eval()
    with torch.no_grad():
        y = model(_images()).double()
    assert y.sum().item() == pytest.approx(output_sum, abs=1e-6)
    assert y.abs().sum().item() == pytest.approx(output_abs_sum, abs=1e-6)
    assert not any('predictor' in name for name in model.state_dict())
    assert type(model.blocks) is torch.nn.Sequential
    assert dict(model.state_dict()).keys() == timm.create_model('deit_tiny_patch16_224', img_size=96,
                                                                num_classes=10).state_dict().keys()


def test_inference_keeps_the_other_modes_token_count():
    """Pruned to the top ceil(keep_rate * N) by keep score at every reduction, the kept count of the other modes."""
    model = _model('dynamicvit').eval()
    counts = model.token_counts()
    assert counts == _model('both', num_fused_tokens=0).token_counts()  # kept tokens only: the rest discarded
    n = 36
    for i, block in enumerate(model.blocks):
        if isinstance(block, TokenFusionBlock):
            kept = {mode: fusion_output_counts(mode, n, 0.7, 4)[0] for mode in ('both', 'importance', 'dynamicvit')}
            assert set(kept.values()) == {num_kept(0.7, n)}
            n = kept['dynamicvit']
        assert counts[i] == n + 1
    with torch.no_grad(), record_token_fusion(model) as reductions:
        model(_images())
    assert [r['keep_index'].shape[1] + 1 for r in reductions.values()] == [counts[3], counts[6], counts[9]]
    assert all(int(r['num_clusters']) == 0 for r in reductions.values())


def test_training_masks_instead_of_pruning():
    """Training: every block keeps all tokens, the mask is hard 0/1 and the predictor gets a gradient through it."""
    model = _model('dynamicvit').train()
    assert isinstance(model.blocks, KeepMaskedBlocks)
    widths = []
    handles = [block.register_forward_hook(lambda m, i, o: widths.append(o.shape[1])) for block in model.blocks]
    with record_token_fusion(model) as reductions:
        model(_images()).sum().backward()
    for handle in handles:
        handle.remove()
    assert widths == []  # KeepMaskedBlocks runs the blocks' steps itself: no block forward is called
    masks = [r['keep_mask'] for r in reductions.values()]
    assert [m.shape for m in masks] == [torch.Size([2, 36])] * 3  # all 36 patches throughout
    for earlier, later in zip(masks, masks[1:]):
        assert torch.all(later <= earlier)  # dropped once, dropped for good
    for mask in masks:
        assert torch.all((mask == 0) | (mask == 1))
    for block in (model.blocks[3], model.blocks[6], model.blocks[9]):
        grads = [p.grad for p in block.fusion.predictor.parameters()]
        assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_gumbel_keep_mask_is_straight_through():
    log_probs = torch.randn(3, 5, 2).log_softmax(-1).requires_grad_()
    previous = torch.tensor([[1., 1., 0., 1., 1.]] * 3)
    mask = gumbel_keep_mask(log_probs, previous)
    assert torch.all((mask == 0) | (mask == 1)) and torch.all(mask[:, 2] == 0)
    (mask * torch.arange(5.)).sum().backward()
    assert log_probs.grad.abs().sum() > 0


def test_keep_mask_softmax_masks_dropped_keys():
    scores = torch.randn(1, 2, 4, 4)
    keep = torch.tensor([[1., 0., 1., 1.]])
    attn = keep_mask_softmax(scores, keep)
    assert attn.sum(-1).allclose(torch.ones(1, 2, 4))
    assert attn[:, :, [0, 2, 3], 1].abs().max() < 1e-5  # no kept query reads the dropped token
    assert attn[:, :, 1].allclose(scores[:, :, 1].softmax(-1), atol=1e-5)  # a dropped query reads itself too
    kept = [0, 2, 3]
    expected = scores[:, :, kept][..., kept].softmax(-1)
    assert attn[:, :, kept][..., kept].allclose(expected, atol=1e-5)


def test_ratio_loss_hand_computed():
    mask = torch.tensor([[1., 1., 0., 0.], [1., 1., 1., 0.]])  # kept shares 0.5 and 0.75
    target = torch.tensor(0.7)
    expected = ((0.5 - 0.7) ** 2 + (0.75 - 0.7) ** 2) / 2
    assert ratio_loss(mask, target).item() == pytest.approx(expected)


def test_ratio_loss_through_the_objective():
    model = _model('dynamicvit').train()
    objective = TokenFusionObjective(model, 0., 0., gamma=2.)
    with record_token_fusion(model) as reductions:
        logits = model(_images())
    loss, terms = objective()
    # the targets: the evaluation forward's kept share of the 36 patches at each reduction (26, 19, 14)
    targets = [26 / 36, 19 / 36, 14 / 36]
    expected = torch.stack([ratio_loss(r['keep_mask'], torch.tensor(t)) for r, t in zip(reductions.values(), targets)])
    assert terms['ratio'] == pytest.approx(expected.mean().item(), rel=1e-5)
    assert loss.item() == pytest.approx(2 * expected.mean().item(), rel=1e-5)
    (logits.sum() + loss).backward()
    objective.remove()


def test_create_model_forward_backward_and_predictor_loading():
    model = _model('dynamicvit')
    model.train()
    model(_images()).logsumexp(-1).mean().backward()
    model.eval()
    with torch.no_grad():
        assert model(_images()).shape == (2, 10)
    # a dense DeiT state dict loads strictly once the filter adds the predictors as initialised
    from timm_recursive.models.deit_token_fusion import checkpoint_filter_fn
    dense = timm.create_model('deit_tiny_patch16_224', img_size=96, num_classes=10).state_dict()
    model.load_state_dict(checkpoint_filter_fn(dense, model), strict=True)
    assert model.pos_embed.equal(dense['pos_embed'])
    assert sum('predictor' in k for k in model.state_dict()) > 0
    # configuring another mode afterwards restores the plain sequence and the strict dense keys
    from timm_recursive.models import apply_token_fusion
    apply_token_fusion(model, mode='both')
    assert type(model.blocks) is torch.nn.Sequential
    model.load_state_dict(dense, strict=True)
