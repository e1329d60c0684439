"""Dropout whose random mask costs a fraction of torch's on CPU, for training.

torch's CPU dropout draws one Mersenne-Twister number per element (`aten::bernoulli_`): about a
third of a frozen-lower-layers training step of the ranker (torch.profiler, bf16, batch 32). Here
one 64-bit draw gives the keep/drop bits of four elements (15 bits each), so p is rounded to a
multiple of 1/32768 (0.1 -> 0.100006) and outputs are scaled by 1 / (1 - that p): the same
distribution as `nn.Dropout(p)` to 3e-5 in p, from a different random stream. GPUs keep torch's
own (fused) dropout.

`fast_dropout(model)` swaps a model's `nn.Dropout` modules and its Hugging Face attention for these
while training and restores them after, so checkpoints, export and serving never see them.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

_BITS = 15  # bits per element from each 64-bit draw (random_() leaves the top bit 0)
_SCALE = 1 << _BITS
ATTENTION_NAME = "pars_fast_dropout"


def keep_mask(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean mask, True with probability 1 - round(p * 2^15) / 2^15, independently per element."""
    n = math.prod(shape)
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()
    chunks = draws.view(torch.int16)[:n] & (_SCALE - 1)
    return (chunks >= round(p * _SCALE)).view(shape)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)` with the cheap CPU mask."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    dropped = round(p * _SCALE)
    keep = keep_mask(x.shape, p, x.device)
    return x * (keep.to(x.dtype) * (_SCALE / (_SCALE - dropped)))


class FastDropout(nn.Module):
    """nn.Dropout with the cheap CPU mask (no parameters: state dicts do not change)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    scale: float,
) -> torch.Tensor:
    """`F.scaled_dot_product_attention` (mask: boolean, True where attended, or additive); with
    dropout on CPU the explicit product with the cheap mask on the weights, in float32 as SDPA's
    math path computes it there (bfloat16 weights and softmax double the error), returned in the
    query's dtype."""
    if dropout_p == 0.0 or query.device.type != "cpu":
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    with torch.autocast("cpu", enabled=False):
        weights = torch.matmul(query.float(), key.float().transpose(-2, -1)) * scale
        if mask is not None:
            weights = weights.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else weights + mask.float()
        out = torch.matmul(dropout(weights.softmax(-1), dropout_p), value.float())
    return out.to(query.dtype)


def _hf_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """A Hugging Face attention function (transformers' AttentionInterface) over `scaled_dot_product_attention`."""
    scale = scaling if scaling is not None else query.size(-1) ** -0.5
    groups = int(getattr(module, "num_key_value_groups", 1))
    if groups > 1:  # grouped-query attention (Llama): transformers leaves repeating the heads to us
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = scaled_dot_product_attention(query, key, value, attention_mask, float(dropout), scale)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def fast_dropout(model: nn.Module):
    """Within: every `nn.Dropout` of `model` is a FastDropout of the same p, and Hugging Face
    sub-models that use SDPA use `_hf_attention`; restored on exit."""
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, _hf_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # SDPA's masks
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    configs = []
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                fast = FastDropout(child.p)
                fast.train(child.training)
                setattr(parent, name, fast)
                swapped.append((parent, name, child))
        if isinstance(parent, PreTrainedModel) and parent.config._attn_implementation == "sdpa":
            configs.append(parent.config)
    for config in configs:
        config._attn_implementation_internal = ATTENTION_NAME
    try:
        yield model
    finally:
        for config in configs:
            config._attn_implementation_internal = "sdpa"
        for parent, name, child in swapped:
            child.train(getattr(parent, name).training)
            setattr(parent, name, child)
