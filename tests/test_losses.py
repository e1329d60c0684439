"""The three losses, pinned by values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.ranking.losses import LOSSES, listwise_loss, pairwise_loss, pointwise_loss


def test_pairwise_margin_ranking_by_hand():
    scores = torch.tensor([2.0, 0.5, 1.0])
    lengths = torch.tensor([100.0, 300.0, 50.0])
    pairs = torch.tensor([[0, 1], [0, 2], [1, 2]])
    # (0,1): y=-1, max(0, (2-0.5) + 1) = 2.5 ; (0,2): y=+1, max(0, -(2-1) + 1) = 0
    # (1,2): y=+1, max(0, -(0.5-1) + 1) = 1.5 ; mean = 4/3
    assert pairwise_loss(scores, lengths, pairs).item() == pytest.approx(4.0 / 3.0)
    assert pairwise_loss(scores, lengths, pairs, margin=0.0).item() == pytest.approx((1.5 + 0 + 0.5) / 3)


def test_pairwise_graded_margin_by_hand():
    scores = torch.tensor([2.0, 0.5, 1.0])
    lengths = torch.tensor([math.e - 1, math.e**3 - 1, math.e**0.5 - 1])  # log(1+len) = 1, 3, 0.5
    pairs = torch.tensor([[0, 1], [0, 2], [1, 2]])
    # margins |dlog|: 2, 0.5, 2.5
    # (0,1): y=-1, max(0, (2-0.5) + 2) = 3.5 ; (0,2): y=+1, max(0, -(2-1) + 0.5) = 0
    # (1,2): y=+1, max(0, -(0.5-1) + 2.5) = 3 ; mean = 6.5/3
    graded = pairwise_loss(scores, lengths, pairs, margin=0.0, margin_per_log_length=1.0)
    assert graded.item() == pytest.approx(6.5 / 3.0)
    # a constant part adds to every margin: 4.5, max(0, -1 + 1.5) = 0.5, 4 ; mean = 3
    both = pairwise_loss(scores, lengths, pairs, margin=1.0, margin_per_log_length=1.0)
    assert both.item() == pytest.approx(3.0)


def test_pairwise_without_pairs_is_zero_but_differentiable():
    scores = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = pairwise_loss(scores, torch.tensor([1.0, 2.0]), torch.zeros((0, 2), dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and scores.grad is not None


def test_pointwise_regresses_on_log1p_length_by_hand():
    scores = torch.tensor([0.0, 1.0])
    lengths = torch.tensor([0.0, math.e - 1])  # targets log(1+0)=0 and log(e)=1
    assert pointwise_loss(scores, lengths, None).item() == pytest.approx(0.0)
    # targets log(1+1)=ln2, log(1+3)=ln4; errors (1-ln2)^2 and (1-ln4)^2, mean of the two
    expect = ((1 - math.log(2)) ** 2 + (1 - math.log(4)) ** 2) / 2
    assert pointwise_loss(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 3.0]), None).item() == pytest.approx(expect)


def test_listwise_listmle_by_hand():
    # order by length, longest first: indices 1 (30), 2 (20), 0 (10); sorted scores [3, 1, 2]
    scores = torch.tensor([2.0, 3.0, 1.0])
    lengths = torch.tensor([10.0, 30.0, 20.0])
    # -log P = [log(e^3+e^1+e^2) - 3] + [log(e^1+e^2) - 1] + [log(e^2) - 2], divided by 3
    expect = (math.log(math.exp(3) + math.exp(1) + math.exp(2)) - 3 + math.log(math.exp(1) + math.exp(2)) - 1) / 3
    assert listwise_loss(scores, lengths, None).item() == pytest.approx(expect)
    # the correct order scores lower than the reversed one
    assert listwise_loss(torch.tensor([1.0, 3.0, 2.0]), lengths, None) < listwise_loss(
        torch.tensor([3.0, 1.0, 2.0]), lengths, None
    )


def test_one_signature_for_all_methods():
    scores = torch.zeros(5, requires_grad=True)  # every margin violated: all three losses have a gradient
    lengths = torch.tensor([5.0, 50.0, 500.0, 20.0, 200.0])
    pairs = torch.tensor([[0, 1], [2, 3]])
    for name, fn in LOSSES.items():
        loss = fn(scores, lengths, pairs)
        assert loss.ndim == 0 and torch.isfinite(loss), name
        (grad,) = torch.autograd.grad(loss, scores)
        assert grad.abs().sum() > 0, name


def test_pointwise_cut_answer_is_a_lower_bound():
    lengths = torch.tensor([math.e - 1, math.e**2 - 1])  # targets log1p: 1, 2
    cut = torch.tensor([False, True])
    # below the cut label: the usual squared error; above it: free
    assert pointwise_loss(torch.tensor([1.0, 1.0]), lengths, None, cut).item() == pytest.approx(0.5)
    assert pointwise_loss(torch.tensor([3.0, 3.0]), lengths, None, cut).item() == pytest.approx(2.0)
    # nothing cut: the plain mean squared error, bit for bit
    scores = torch.tensor([0.3, 2.5])
    none_cut = torch.zeros(2, dtype=torch.bool)
    assert torch.equal(pointwise_loss(scores, lengths, None, none_cut), pointwise_loss(scores, lengths, None))


def test_listwise_cut_answer_compares_only_with_prompts_surely_shorter():
    lengths = torch.tensor([3.0, 2.0, 1.0])
    zeros = torch.zeros(3)
    # prompt 1 is cut: it leaves prompt 0's comparison set and keeps only the uncut prompt 2 in its own
    cut = torch.tensor([False, True, False])
    expect = (math.log(2) + math.log(2) + 0.0) / 3
    assert listwise_loss(zeros, lengths, None, cut).item() == pytest.approx(expect)
    assert listwise_loss(zeros, lengths, None).item() == pytest.approx((math.log(3) + math.log(2)) / 3)
    # a cut prompt scored far above a longer-labelled uncut one: the uncut one's term ignores it
    scores = torch.tensor([0.0, 5.0, -9.0], dtype=torch.float64)
    terms = [math.log(1 + math.exp(-9.0)), math.log(math.exp(5.0) + math.exp(-9.0)) - 5.0, 0.0]
    assert listwise_loss(scores, lengths, None, cut).item() == pytest.approx(sum(terms) / 3, rel=1e-5)
    # cut prompts last or everywhere: finite gradients (the -inf of an empty comparison set stays out of them)
    for flags in ([False, True, True], [True, True, True]):
        leaf = torch.tensor([0.3, 1.0, -0.5], requires_grad=True)
        (grad,) = torch.autograd.grad(listwise_loss(leaf, lengths, None, torch.tensor(flags)), leaf)
        assert torch.isfinite(grad).all()
    # nothing cut: ListMLE bit for bit
    scores = torch.tensor([0.7, -0.2, 1.3])
    assert torch.equal(
        listwise_loss(scores, lengths, None, torch.zeros(3, dtype=torch.bool)), listwise_loss(scores, lengths, None)
    )


def test_listwise_breaks_ties_at_random_not_by_input_order():
    """Equal lengths are ordered at random: with micro_batches > 1 the batch arrives sorted by prompt
    token count, and a stable sort would always list the shorter prompt first (as the longer)."""
    import itertools

    scores = torch.tensor([3.0, 2.0, 1.0])  # the input order is the one ListMLE scores best
    lengths = torch.full((3,), 7.0)
    torch.manual_seed(0)
    seen = [listwise_loss(scores, lengths, None).item() for _ in range(600)]
    in_order = listwise_loss(scores, torch.tensor([3.0, 2.0, 1.0]), None).item()
    assert min(seen) == pytest.approx(in_order) and max(seen) > in_order + 0.1  # not always the input order
    # on average every order of the tie counts alike
    every = [
        listwise_loss(scores[list(p)], torch.tensor([3.0, 2.0, 1.0]), None).item()
        for p in itertools.permutations(range(3))
    ]
    assert sum(seen) / len(seen) == pytest.approx(sum(every) / len(every), rel=0.03)
    # the censored branch takes the same shuffled order
    cut = torch.tensor([False, True, False])
    torch.manual_seed(0)
    assert len({round(listwise_loss(scores, lengths, None, cut).item(), 6) for _ in range(50)}) > 1
