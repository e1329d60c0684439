"""The cheap CPU dropout used while training (pipeline.ranking.dropout)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.ranking.dropout import FastDropout, dropout, fast_dropout, keep_mask, scaled_dot_product_attention


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_mask_drops_with_probability_p(p):
    torch.manual_seed(0)
    keep = keep_mask(torch.Size([1000, 1001]), p)  # an element count that is not a multiple of 4
    assert keep.shape == (1000, 1001) and keep.dtype == torch.bool
    assert abs(keep.float().mean().item() - (1 - p)) < 0.002
    # the four elements of one 64-bit draw are independent: neighbours agree as often as chance says
    flat = keep.flatten()[: 4 * 250_000].view(-1, 4).float()
    both = (flat[:, 0] * flat[:, 1]).mean().item()
    assert abs(both - (1 - p) ** 2) < 0.003


def test_dropout_keeps_the_mean_and_is_off_in_eval():
    torch.manual_seed(1)
    x = torch.ones(2_000_000)
    out = dropout(x, 0.1)
    values = torch.unique(out)
    assert len(values) == 2 and values[0] == 0.0 and abs(values[1].item() - 1 / 0.9) < 1e-4
    assert abs(out.mean().item() - 1.0) < 0.003
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    module = FastDropout(0.1).eval()
    assert module(x) is x
    bf16 = dropout(torch.ones(1000, dtype=torch.bfloat16), 0.1)
    assert bf16.dtype == torch.bfloat16
    # seeded like torch's own dropout: the global generator
    torch.manual_seed(3)
    a = dropout(torch.ones(100), 0.3)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(torch.ones(100), 0.3))


@pytest.mark.parametrize("boolean", [True, False])
def test_explicit_attention_equals_sdpa(boolean):
    """With dropout on, attention is the explicit product; at a p that rounds to no drops it must
    equal torch's SDPA, for boolean and additive masks."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 5, 8) for _ in range(3))
    attended = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    attended[1, ..., 3:] = False
    mask = attended if boolean else (~attended).float() * torch.finfo(torch.float32).min
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    got = scaled_dot_product_attention(q, k, v, mask, 1e-6, 0.3)  # the explicit path, nothing dropped
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(scaled_dot_product_attention(q, k, v, mask, 0.0, 0.3), want, atol=1e-6)


def test_fast_dropout_swaps_while_training_and_restores(tiny_ranker):
    """Inside the context every dropout is the cheap one and the encoder's attention is ours; the
    network computes what it computed before (checked with nothing dropped); on exit the model is
    as it was, so checkpoints never see the swap."""
    torch.manual_seed(4)
    ids = torch.randint(1000, 2000, (4, 9))
    mask = torch.ones_like(ids)
    mask[2, 4:] = 0
    tiny_ranker.eval()
    with torch.no_grad():
        want = tiny_ranker.full_forward(input_ids=ids, attention_mask=mask)
    originals = [m for m in tiny_ranker.modules() if type(m) is torch.nn.Dropout]
    keys = set(tiny_ranker.state_dict())
    with fast_dropout(tiny_ranker):
        swapped = [m for m in tiny_ranker.modules() if isinstance(m, FastDropout)]
        assert len(swapped) == len(originals) and not any(type(m) is torch.nn.Dropout for m in tiny_ranker.modules())
        assert tiny_ranker.encoder.config._attn_implementation == "pars_fast_dropout"
        for m in swapped:
            m.p = 1e-6  # rounds to no drops: the explicit attention and masks run, nothing is dropped
        tiny_ranker.train()
        for forward in (tiny_ranker.full_forward, tiny_ranker.forward):  # HF's layers, and ours
            got = forward(input_ids=ids, attention_mask=mask)
            assert torch.allclose(got, want, atol=1e-5)
        got.sum().backward()
        assert tiny_ranker.head.weight.grad is not None
        for m in swapped:
            m.p = 0.5
        assert not torch.allclose(tiny_ranker(input_ids=ids, attention_mask=mask), want, atol=1e-3)
    assert [m for m in tiny_ranker.modules() if type(m) is torch.nn.Dropout] == originals
    assert all(m.training for m in originals)  # the mode set inside carries back
    assert tiny_ranker.encoder.config._attn_implementation == "sdpa"
    assert set(tiny_ranker.state_dict()) == keys
