"""Adaptive halting: per-image exits that really skip compute, and the learned halting head's objectives."""
import math

import pytest
import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from timm_recursive.analysis import adaptive_macs, forward_macs
from timm_recursive.layers import (
    HaltingHead,
    act_loss,
    act_weights,
    geometric_prior,
    halting_distribution,
    ponder_net_loss,
)

NUM_STEPS = 8


def _model(**kwargs):
    torch.manual_seed(0)
    return timm.create_model('recursive_dsa_moe_tiny', in_chans=1, num_steps=NUM_STEPS, **kwargs).eval()


@pytest.fixture(scope='module')
def spread_model():
    """A random model whose images halt at different steps: a sharper classifier (so confidences
    differ between images, on images of very different contrast) and a halting head that follows
    the first class's logit."""
    model = _model(halting_head=True)
    with torch.no_grad():
        model.head.weight.mul_(3.)
        model.halting_head.fc.weight.copy_(3. * model.head.weight[:1])
    return model


@pytest.fixture(scope='module')
def images():
    torch.manual_seed(1)
    return torch.randn(32, 1, 28, 28) * torch.linspace(0.1, 3., 32).view(-1, 1, 1, 1)


@pytest.fixture(scope='module')
def fixed_steps(spread_model, images):
    with torch.no_grad():
        return spread_model.forward_steps_halting(images)


def _first_step(reached: torch.Tensor) -> torch.Tensor:
    """1-based first step (T, B) -> (B,) that is True, the last step where none is."""
    reached = reached.clone()
    reached[-1] = True
    return reached.float().argmax(0) + 1


def _spread_threshold(signal: torch.Tensor, reached_at) -> float:
    """The threshold between two observed values of ``signal`` that spreads the halting steps the most,
    with a margin so that floating-point noise cannot move an image across it."""
    values = signal.flatten().unique()
    best, best_count = None, 0
    for low, high in zip(values[:-1].tolist(), values[1:].tolist()):
        if high - low < 1e-4:
            continue
        threshold = (low + high) / 2
        count = len(_first_step(reached_at(threshold)).unique())
        if count > best_count:
            best, best_count = threshold, count
    assert best_count >= 2, 'the fixture should halt images at different steps'
    return best


def _criterion_reference(criterion: str, logits: torch.Tensor, halting_logits: torch.Tensor):
    """The halting signal per step (T, B) and the test 'has it halted' for a threshold, from the fixed steps."""
    probs = logits.float().softmax(-1)
    if criterion == 'confidence':
        signal = probs.amax(-1)
        return signal, lambda threshold: signal >= threshold
    if criterion == 'change':
        change = (probs[1:] - probs[:-1]).abs().sum(-1) / 2
        signal = torch.cat([torch.full_like(change[:1], math.inf), change])  # step 1 never halts
        return change, lambda threshold: signal <= threshold
    signal = 1. - torch.sigmoid(-halting_logits.float()).cumprod(0)
    return signal, lambda threshold: signal >= threshold


@pytest.mark.parametrize('criterion', ['confidence', 'change', 'halting'])
def test_halted_logits_equal_fixed_step_logits(spread_model, images, fixed_steps, criterion):
    logits, halting_logits, _ = fixed_steps
    signal, reached_at = _criterion_reference(criterion, logits, halting_logits)
    threshold = _spread_threshold(signal, reached_at)
    out, steps = spread_model.forward_adaptive(images, threshold=threshold, criterion=criterion)
    assert steps.dtype == torch.long
    torch.testing.assert_close(steps, _first_step(reached_at(threshold)))
    # each image's logits are the fixed recursion's at its own step (a smaller batch only reorders sums)
    torch.testing.assert_close(out, logits[steps - 1, torch.arange(len(images))], rtol=1e-5, atol=1e-5)


def test_halted_images_leave_the_batch(spread_model, images, fixed_steps):
    """Every block call runs only on the images still running: its tokens are each image's own steps."""
    signal, reached_at = _criterion_reference('confidence', *fixed_steps[:2])
    threshold = _spread_threshold(signal, reached_at)
    calls = []
    handle = spread_model.blocks[0].register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape[:2])))
    try:
        _, steps = spread_model.forward_adaptive(images, threshold=threshold)
    finally:
        handle.remove()
    running = [int((steps >= t).sum()) for t in range(1, int(steps.max()) + 1)]
    # step t runs the images that have not halted before it, at the one history length t + 2
    assert calls == [(n, t + 2) for t, n in enumerate(running, start=1)]
    tokens = sum(b * n for b, n in calls)
    assert tokens == sum(sum(t + 2 for t in range(1, s + 1)) for s in steps.tolist())
    assert tokens < len(images) * sum(t + 2 for t in range(1, NUM_STEPS + 1))


def test_fixed_budget_and_no_threshold(spread_model, images, fixed_steps):
    with torch.no_grad():
        full = spread_model(images)
    out, steps = spread_model.forward_adaptive(images)
    assert torch.equal(out, full) and bool((steps == NUM_STEPS).all())
    out, steps = spread_model.forward_adaptive(images, max_steps=3)
    assert torch.equal(out, fixed_steps[0][2]) and bool((steps == 3).all())
    # every change is within 1 (total variation): every image halts at step 2, the first it can
    out, steps = spread_model.forward_adaptive(images, threshold=1.0, criterion='change')
    assert torch.equal(out, fixed_steps[0][1]) and bool((steps == 2).all())


def test_halting_off_is_bit_for_bit_unchanged(images):
    plain, with_head = _model(), _model(halting_head=True)
    assert not any('halting' in k for k in plain.state_dict())
    assert plain.halting_head is None
    # the head is created last: every other weight, and so every output, is the same
    head_free = {k: v for k, v in with_head.state_dict().items() if not k.startswith('halting_head.')}
    assert head_free.keys() == plain.state_dict().keys()
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in head_free.items())
    with torch.no_grad():
        assert torch.equal(plain(images), with_head(images))
        steps_plain, aux_plain = plain.forward_steps(images)
        steps_head, _, aux_head = with_head.forward_steps_halting(images)
    assert torch.equal(steps_plain, steps_head) and torch.equal(aux_plain, aux_head)


def test_halt_threshold_makes_eval_forward_stop_early(spread_model, images, fixed_steps):
    """``halt_threshold`` turns eval-mode ``forward`` into the early exit; training and scripting keep the recursion."""
    signal, reached_at = _criterion_reference('confidence', *fixed_steps[:2])
    threshold = _spread_threshold(signal, reached_at)
    early = _model(halting_head=True, halt_threshold=threshold)
    early.load_state_dict(spread_model.state_dict())
    expected, steps = spread_model.forward_adaptive(images, threshold=threshold)
    assert len(steps.unique()) >= 2
    with torch.no_grad():
        assert torch.equal(early(images), expected)
        early.set_halting(None)
        assert torch.equal(early(images), spread_model(images))
        early.set_halting(threshold)
        early.train()  # batch statistics: the fixed recursion, not the early exit
        assert torch.equal(early(images), early.forward_head(early.forward_features(images)))
    early.eval()
    scripted = torch.jit.script(early)  # TorchScript keeps the fixed recursion
    with torch.no_grad():
        fixed = early.forward_head(early.forward_features(images))
        torch.testing.assert_close(scripted(images), fixed, rtol=1e-5, atol=1e-5)
        assert not torch.equal(early(images), fixed)
    with pytest.raises(ValueError, match=r'threshold must be a number in \(0, 1\], got 2'):
        _model(halt_threshold=2)
    with pytest.raises(ValueError, match="criterion 'halting' needs a model built with halting_head=True"):
        _model(halt_threshold=0.5, halt_criterion='halting')
    with pytest.raises(ValueError, match='halt_criterion must be one of'):
        _model(halt_criterion='entropy')


@pytest.mark.parametrize('threshold', [0, 0., -0.1, 1.5, math.nan, '0.5', True])
def test_bad_threshold_is_a_clear_error(spread_model, images, threshold):
    with pytest.raises(ValueError, match=rf'threshold must be a number in \(0, 1\], got {threshold!r}'):
        spread_model.forward_adaptive(images[:2], threshold=threshold)


def test_bad_arguments_are_clear_errors(spread_model, images):
    with pytest.raises(ValueError, match=r'max_steps must be an integer in \[1, num_steps=8\], got 9'):
        spread_model.forward_adaptive(images[:2], max_steps=9)
    with pytest.raises(ValueError, match="criterion must be one of"):
        spread_model.forward_adaptive(images[:2], threshold=0.5, criterion='entropy')
    with pytest.raises(ValueError, match="criterion 'halting' needs a model built with halting_head=True"):
        _model().forward_adaptive(images[:2], threshold=0.5, criterion='halting')
    with pytest.raises(RuntimeError, match='halting_head=True'):
        _model().forward_steps_halting(images[:2])


@pytest.mark.parametrize('criterion', ['confidence', 'halting'])
def test_adaptive_macs_match_flop_counter(unfused_attention, spread_model, images, fixed_steps, criterion):
    signal, reached_at = _criterion_reference(criterion, *fixed_steps[:2])
    threshold = _spread_threshold(signal, reached_at)
    with FlopCounterMode(display=False) as counter:
        _, steps = spread_model.forward_adaptive(images, threshold=threshold, criterion=criterion)
    per_image = adaptive_macs(spread_model, (28, 28), steps.tolist(), halting_head=criterion == 'halting')
    assert counter.get_total_flops() == 2 * sum(per_image)
    assert forward_macs(spread_model, (28, 28), NUM_STEPS) == forward_macs(spread_model, (28, 28))
    assert max(per_image) <= forward_macs(spread_model, (28, 28))


def test_halting_distribution_is_a_distribution():
    torch.manual_seed(0)
    logits = torch.randn(16, 5) * 4
    p = halting_distribution(logits)
    assert bool((p >= 0).all())
    torch.testing.assert_close(p.sum(0), torch.ones(5))
    # the probability of halting exactly at t is the conditional halting probability times not halting before
    lam = torch.sigmoid(logits)
    torch.testing.assert_close(p[2], lam[2] * (1 - lam[0]) * (1 - lam[1]))
    prior = geometric_prior(16, 0.2)
    torch.testing.assert_close(prior.sum(), torch.tensor(1.))
    torch.testing.assert_close(prior[1] / prior[0], torch.tensor(0.8))
    weights, ponder = act_weights(logits)
    torch.testing.assert_close(weights.sum(0), torch.ones(5))
    assert bool((weights >= 0).all()) and bool((ponder >= 1).all()) and bool((ponder <= 17).all())


@pytest.mark.parametrize('objective', ['ponder_net', 'act'])
def test_halting_objectives_decrease_on_a_toy_batch(objective):
    """Class logits and halting logits of 6 steps from a small net: both objectives train it."""
    torch.manual_seed(0)
    num_steps, batch, dim, classes = 6, 32, 16, 4
    x = torch.randn(batch, dim)
    target = torch.randint(0, classes, (batch,))
    cell = torch.nn.GRUCell(dim, dim)
    readout = torch.nn.Linear(dim, classes)
    head = HaltingHead(dim)
    params = [*cell.parameters(), *readout.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)

    def loss():
        h, states = torch.zeros(batch, dim), []
        for _ in range(num_steps):
            h = cell(x, h)
            states.append(h)
        states = torch.stack(states)
        if objective == 'ponder_net':
            return ponder_net_loss(readout(states), head(states), target, lambda_p=0.3, beta=0.01)[0]
        return act_loss(readout(states), head(states), target, tau=0.01)[0]

    first = loss()
    for _ in range(30):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert loss().item() < 0.7 * first.item()


def test_halting_head_gets_gradient_through_the_model(images):
    model = _model(halting_head=True).train()
    logits, halting_logits, aux = model.forward_steps_halting(images[:4])
    assert halting_logits.shape == (NUM_STEPS, 4)
    loss = ponder_net_loss(logits, halting_logits, torch.tensor([0, 1, 2, 3]))[0] + 0.01 * aux
    loss.backward()
    assert model.halting_head.fc.weight.grad.abs().sum() > 0
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    # the head starts at its initial halting probability, which re-initialising the model keeps
    model.init_weights()
    torch.testing.assert_close(torch.sigmoid(model.halting_head.bias.detach()), torch.tensor([0.1]))


@pytest.mark.slow
def test_study_command(tmp_path, capsys):
    """The measurement command on scikit-learn's digits: JSON with every threshold's row, and its errors."""
    import json

    from timm_recursive.cli.adaptive_halting import main
    from timm_recursive.runs import export_model
    torch.manual_seed(0)
    export_model(timm.create_model('recursive_dsa_moe_tiny', num_classes=10, in_chans=1, num_steps=4),
                 str(tmp_path / 'm'))
    args = ['--checkpoint', str(tmp_path / 'm'), '--dataset', 'digits', '--eval-samples', '120', '--batch-size', '50',
            '--timing-images', '50', '--repeats', '1']
    assert main(args + ['--thresholds', '0.1', '0.99']) == 0
    result = json.loads(capsys.readouterr().out)
    assert result['eval_images'] == 120 and [f['steps'] for f in result['fixed']] == [1, 2, 3, 4]
    low, high = result['thresholds']
    assert sum(low['step_histogram']) == 120 and low['max_steps'] == 1  # every image is 10% sure at step 1
    assert high['mean_steps'] >= low['mean_steps'] and high['macs_per_image'] >= low['macs_per_image']
    assert low['macs_per_image'] == result['fixed'][0]['macs_per_image']
    assert list(low['vs_fixed']) == ['1', '4'] and low['vs_fixed']['1'] == {'gain': 0.0, 'ci95': 0.0}
    # the cheapest matching threshold is chosen on the 135 training images a default run holds out
    assert result['matching'] is None or result['matching']['chosen_on'] == '135 held-out training images'
    # every image halts at step 1 at threshold 0.1: nothing runs on, no image is hard
    assert low['still_running'] == [{'step': 1, 'images': 120, 'top1_step1': result['fixed'][0]['top1'],
                                     'top1': result['fixed'][0]['top1']}]
    assert low['hard_images'] == {'images': 0}
    running = [s['images'] for s in high['still_running']]
    assert running[0] == 120 and running == sorted(running, reverse=True) and len(running) == high['max_steps']
    assert running[1:] == [sum(high['step_histogram'][t:]) for t in range(1, len(running))]
    # chosen on the evaluation images themselves only when asked, and then it matches there
    assert main(args + ['--thresholds', '0.1', '0.99', '--val-fraction', '0']) == 0
    matching = json.loads(capsys.readouterr().out)['matching']
    assert matching is None or (matching['chosen_on'] == 'the evaluation images themselves'
                                and matching['top1'] >= result['fixed'][-1]['top1'])
    assert high['hard_images']['images'] == 120 - high['step_histogram'][0]
    from timm_recursive.analysis.adaptive_halting import still_running_table
    assert still_running_table(result, 0.99).splitlines()[2].startswith('| 1 | 120 |')
    assert {'date', 'commit', 'machine', 'wall_s'} <= set(result) and result['checkpoint_epoch'] is None
    assert main(args + ['--thresholds', '0.5', '--markdown']) == 0
    assert '| confidence 0.5 |' in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_status:
        main(args + ['--thresholds', '1.5'])
    assert exit_status.value.code == 2
    assert 'threshold must be a number in (0, 1], got 1.5' in capsys.readouterr().err


def test_halting_losses_take_soft_targets():
    """Mixup/CutMix targets (class probabilities) give the same loss as their class indices when one-hot."""
    torch.manual_seed(0)
    logits, halting_logits, target = torch.randn(5, 3, 4), torch.randn(5, 3), torch.tensor([0, 3, 1])
    one_hot = torch.nn.functional.one_hot(target, 4).float()
    for loss in (ponder_net_loss, act_loss):
        torch.testing.assert_close(loss(logits, halting_logits, one_hot)[0], loss(logits, halting_logits, target)[0])


@pytest.mark.slow
def test_evaluate_measures_halting(tmp_path, capsys):
    """timm-recursive-evaluate --halting-thresholds adds the per-threshold table and a 'halting' entry."""
    import argparse
    import json

    from timm_recursive.analysis.adaptive_halting import check_halting_arguments
    from timm_recursive.cli import evaluate
    from timm_recursive.runs import export_model
    torch.manual_seed(0)
    export_model(timm.create_model('recursive_dsa_moe_tiny', num_classes=10, in_chans=1, num_steps=4),
                 str(tmp_path / 'm'))
    args = ['--checkpoint', str(tmp_path / 'm'), '--dataset', 'digits', '--max-eval-samples', '60', '-b', '25']
    out = tmp_path / 'results.json'
    assert evaluate.main(args + ['--halting-thresholds', '0.1', '0.99', '--halting-timing-images', '25',
                                 '--halting-repeats', '1', '--results-file', str(out)]) == 0
    printed = capsys.readouterr().out
    assert '| confidence 0.1 |' in printed and '| confidence 0.99 |' in printed
    halting = json.loads(out.read_text())['halting']
    assert [r['threshold'] for r in halting['thresholds']] == [0.1, 0.99] and halting['eval_images'] == 60
    assert halting['timing']['images'] == 25
    assert evaluate.main(args + ['--halting-thresholds', '0.5', '--halting-criterion', 'halting']) == 2
    assert "criterion 'halting' needs a model built with halting_head=True" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(args + ['--halting-thresholds', '0'])
    assert 'threshold must be a number in (0, 1], got 0.0' in capsys.readouterr().err
    with pytest.raises(ValueError, match='needs a recursive classifier, not Linear'):
        check_halting_arguments(torch.nn.Linear(2, 2), argparse.Namespace(halting_thresholds=[0.5]))
