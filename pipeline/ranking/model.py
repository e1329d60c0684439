"""The plain predictor: a Hugging Face encoder's pooled output ([CLS] vector, the paper's, the mean
over the prompt's tokens, or the last token's) and a linear head, one score per prompt, higher =
longer answer. The encoder is BERT-style (BERT, MiniLM, MPNet, ...) or a Llama-style causal LM read
as an encoder (SmolLM2: its prompt framed by its chat template, the last position read, where the
answer would start). No Lightning here: export and serving use this module alone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from pipeline.encoders import resolve_encoder
from pipeline.errors import PARSError
from pipeline.ranking.dropout import scaled_dot_product_attention

POOLINGS = ("cls", "mean", "last")


class LengthRanker(nn.Module):
    """encoder -> pooling ([CLS] vector, mean over non-padding tokens, or the last non-padding
    token) -> dropout -> linear -> score."""

    def __init__(self, encoder: nn.Module, dropout: float = 0.1, pooling: str = "cls"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.encoder = encoder
        self.pooling = pooling
        if pooling == "cls" and self._decoder_style():
            raise ValueError("pooling cls reads a causal LM's first position, which sees no prompt: use last or mean")
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.hidden_size, 1)
        # [CLS] pooling reads the first position only, so the last layer computes that one alone;
        # True computes it everywhere, as the encoder's own forward does (benchmarks compare the two)
        self.last_layer_all_positions = False
        # under bfloat16 autocast, compute the head in float32: a bfloat16 score holds ~3 digits, so
        # close prompts would tie. Scorers set it; bf16-mixed training keeps the head in bfloat16
        self.head_in_float32 = False

    @classmethod
    def from_pretrained_encoder(cls, name: str, dropout: float = 0.1, pooling: str = "cls") -> "LengthRanker":
        return cls(load_encoder(name), dropout=dropout, pooling=pooling)

    @classmethod
    def from_config(cls, config, dropout: float = 0.1, pooling: str = "cls") -> "LengthRanker":
        """An untrained model of the given encoder config (tests, and loading a checkpoint)."""
        from transformers import AutoModel

        return cls(AutoModel.from_config(config), dropout=dropout, pooling=pooling)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        if kwargs or not self._bert_style():
            return self.full_forward(input_ids, attention_mask, **kwargs)
        return self.score_from(self.encoder.embeddings(input_ids=input_ids), attention_mask, 0)

    def full_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """The encoder's own forward over every position (any Hugging Face encoder); `forward` gives
        the same scores for a BERT-style one with less work (tested against this)."""
        if self._decoder_style():
            kwargs.setdefault("use_cache", False)  # one pass over the prompt: no KV cache to keep
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return self._head(out.last_hidden_state, attention_mask)

    def _head(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "mean":
            mask = attention_mask[:, :, None].to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        elif self.pooling == "last":  # right padding: a row's last real token
            last = (attention_mask.sum(1) - 1).clamp(min=0).to(hidden.device)
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        else:
            pooled = hidden[:, 0]
        pooled = self.dropout(pooled)
        if self.head_in_float32 and torch.is_autocast_enabled(pooled.device.type):
            with torch.autocast(pooled.device.type, enabled=False):
                return self.head(pooled.float()).squeeze(-1)
        return self.head(pooled).squeeze(-1)

    # -- the same network in two halves: training with a frozen, cached lower encoder --------
    def _bert_style(self) -> bool:
        layers = getattr(getattr(self.encoder, "encoder", None), "layer", None)
        return isinstance(layers, nn.ModuleList) and hasattr(self.encoder, "embeddings")

    def _decoder_style(self) -> bool:
        """A Llama causal LM's base model (SmolLM2). Only Llama itself: look-alikes (Gemma scales its
        embeddings, Mistral and Qwen may slide their attention window) compute other things in
        their own forward than `_run_decoder_layers` does."""
        enc = self.encoder
        return getattr(getattr(enc, "config", None), "model_type", None) == "llama" and isinstance(
            getattr(enc, "layers", None), nn.ModuleList
        )

    def _layers(self) -> nn.ModuleList:
        if self._decoder_style():
            return self.encoder.layers
        if not self._bert_style():
            raise ValueError(
                f"{type(self.encoder).__name__} is neither a BERT-style encoder (embeddings + "
                f"encoder.layer) nor a Llama-style decoder: train.frozen_layers must be 0 for it"
            )
        return self.encoder.encoder.layer

    def embeddings_module(self) -> nn.Module:
        """The encoder's input embeddings (token embeddings for a decoder)."""
        return self.encoder.embed_tokens if self._decoder_style() else self.encoder.embeddings

    @property
    def num_layers(self) -> int:
        return len(self._layers())

    def freeze_lower(self, n_layers: int) -> None:
        """Embeddings and the first `n_layers` transformer layers take no gradient (their output is
        computed once by `hidden_after` and cached by the trainer)."""
        layers = self._layers()
        if not 0 <= n_layers <= len(layers):
            raise ValueError(f"train.frozen_layers must be in 0..{len(layers)}, got {n_layers}")
        if n_layers:
            self.embeddings_module().requires_grad_(False)
            for layer in layers[:n_layers]:
                layer.requires_grad_(False)
            bias = self._relative_position_bias()
            if bias is not None:  # the frozen layers' cached output used it: it must not move
                bias.requires_grad_(False)

    def hidden_after(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_layers: int) -> torch.Tensor:
        """Hidden states after the embeddings and the first `n_layers` layers."""
        return self._run_layers(self.embeddings_module()(input_ids), attention_mask, 0, n_layers)

    def score_from(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start_layer: int) -> torch.Tensor:
        """Scores from the hidden states after layer `start_layer`: the rest of `forward`.
        score_from(hidden_after(x, m, k), m, k) == forward(x, m) (tested)."""
        if not torch.is_autocast_enabled(hidden.device.type):
            hidden = hidden.to(self.head.weight.dtype)  # a bf16 cache scored outside autocast
        stop = self.num_layers
        if (
            self.pooling == "cls"
            and not self.last_layer_all_positions
            and start_layer < stop
            and _bert_layer(self._layers()[stop - 1])
        ):
            # only the first position's output is read: the last layer computes that one alone
            hidden = self._run_layers(hidden, attention_mask, start_layer, stop - 1)
            hidden = _first_position_layer(self._layers()[stop - 1], hidden, attention_mask)
        else:
            hidden = self._run_layers(hidden, attention_mask, start_layer, stop)
            if self._decoder_style():  # a causal LM normalises its last layer's output
                hidden = self.encoder.norm(hidden)
        return self._head(hidden, attention_mask)

    def _relative_position_bias(self) -> nn.Module | None:
        """MPNet's relative-position bias table (shared by all its layers, which take the bias as an
        argument); None for BERT-style encoders, whose positions are in the embeddings."""
        return getattr(getattr(self.encoder, "encoder", None), "relative_attention_bias", None)

    def _run_layers(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        if self._decoder_style():
            return self._run_decoder_layers(hidden, attention_mask, start, stop)
        # additive mask (batch, 1, 1, keys): 0 where attended, the dtype's minimum on padding
        additive = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        extra = {}
        if start < stop and self._relative_position_bias() is not None:
            # MPNet: the bias depends only on the sequence length, as its encoder computes it
            extra["position_bias"] = self.encoder.encoder.compute_position_bias(hidden).to(hidden.dtype)
        for layer in self._layers()[start:stop]:
            out = layer(hidden, attention_mask=additive, **extra)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def _run_decoder_layers(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int, stop: int):
        # right padding: positions count from 0 in every row, and a real token attends only to
        # the real tokens at or before it (causal and key-padding mask, additive, (batch, 1, q, k)).
        # The residual stream in the weights' dtype, as the model's own forward keeps it under
        # autocast: a bfloat16 cache would otherwise keep every residual sum and rotary angle in bfloat16
        hidden = hidden.to(self.encoder.norm.weight.dtype)
        width = hidden.shape[1]
        positions = torch.arange(width, device=hidden.device)[None].expand(hidden.shape[0], -1)
        rotary = self.encoder.rotary_emb(hidden, position_ids=positions)
        causal = torch.ones(width, width, dtype=torch.bool, device=hidden.device).tril()
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool().to(hidden.device)
        additive = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
        additive = additive.masked_fill(~allowed, torch.finfo(hidden.dtype).min)
        for layer in self._layers()[start:stop]:
            out = layer(hidden, attention_mask=additive, position_ids=positions, position_embeddings=rotary)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden


def _bert_layer(layer: nn.Module) -> bool:
    """A layer laid out as BERT's (RoBERTa and ELECTRA copy it): one the first-position shortcut knows."""
    inner = getattr(getattr(layer, "attention", None), "self", None)
    return all(hasattr(inner, a) for a in ("query", "key", "value", "num_attention_heads", "scaling")) and all(
        hasattr(layer, a) for a in ("intermediate", "output")
    )


def _first_position_layer(layer: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A BERT layer's output at the first position ([CLS]) alone, shape (batch, 1, hidden): keys and
    values from every position, but the query, attention output and feed-forward of that one. The
    feed-forward and three of the four projections are most of a layer's work, so this costs about
    a sixth of the full layer, for the same numbers at that position (up to float rounding)."""
    attention = layer.attention
    inner = attention.self
    batch, width, _ = hidden.shape
    heads, size = inner.num_attention_heads, inner.attention_head_size
    first = hidden[:, :1]
    query = inner.query(first).view(batch, 1, heads, size).transpose(1, 2)
    key = inner.key(hidden).view(batch, width, heads, size).transpose(1, 2)
    value = inner.value(hidden).view(batch, width, heads, size).transpose(1, 2)
    context = scaled_dot_product_attention(
        query,
        key,
        value,
        attention_mask[:, None, None, :].bool(),  # True where attended
        inner.dropout.p if inner.training else 0.0,
        inner.scaling,
    )
    attended = attention.output(context.transpose(1, 2).reshape(batch, 1, heads * size), first)
    return layer.output(layer.intermediate(attended), attended)


# what a pretrained encoder's weights may lack for the ranker: the pooler (it pools the hidden
# states itself) and index buffers that some checkpoints store and others compute
_UNUSED_ENCODER_KEYS = re.compile(r"(^|\.)pooler\.|(^|\.)(position_ids|token_type_ids)$")


def load_encoder(name: str) -> nn.Module:
    """The pretrained encoder `name` (AutoModel). Weights that lack a tensor the ranker uses are a
    PARSError naming the directory and some of the keys: transformers would initialise them at
    random and only log a report. A file it cannot read is a PARSError naming the directory."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    resolved = resolve_encoder(name)
    # quiet: its load report (what matters in it is refused below) and, for a local directory, its
    # progress bar would come before a one-line error; a hub encoder's download progress stays visible
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if Path(resolved).is_dir():
        hf_logging.disable_progress_bar()
    try:
        encoder, info = AutoModel.from_pretrained(resolved, output_loading_info=True)
    except Exception as exc:  # a cut or foreign weights file, a config of another architecture
        raise PARSError(f"encoder {resolved} could not be loaded: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = sorted(k for k in info["missing_keys"] if not _UNUSED_ENCODER_KEYS.search(k))
    if missing:
        raise PARSError(
            f"encoder {resolved}: the weights lack {len(missing)} tensor(s) the ranker uses "
            f"(e.g. {', '.join(missing[:3])}); the weights file is incomplete or of another model"
        )
    return encoder


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer of an encoder or checkpoint. One that loads but cannot encode (an empty
    vocab.txt loads as an empty vocabulary) is a PARSError naming the directory, before any prompt."""
    from transformers import AutoTokenizer

    name = str(name_or_path)
    path = name if name.strip() and Path(name).exists() else resolve_encoder(name)  # Path("") is the cwd
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:  # a cut JSON file: the message names no file
        raise PARSError(f"tokenizer {path} could not be loaded: {exc}") from None
    try:
        tokenizer("a")
    except Exception as exc:  # the tokenizers library's own Exception ("WordPiece error: ...")
        files = [name for name in ("tokenizer.json", "vocab.txt") if (Path(path) / name).is_file()]
        where = " or ".join(str(Path(path) / name) for name in files) or path
        raise PARSError(f"{where}: the tokenizer cannot encode text ({exc}); the vocabulary is damaged") from None
    return tokenizer


class NoRoomForPrompt(ValueError):
    """max_length is taken up by the tokenizer's frame (special tokens or chat template)."""


def encode_prompts(tokenizer, texts, max_length: int, head_fraction: float = 1.0) -> list[list[int]]:
    """Token ids (special tokens included) of at most `max_length` per prompt.

    A longer prompt keeps its first round(head_fraction * body) tokens and its last ones, body being
    max_length minus the special tokens: long chat prompts often paste a document first and put the
    instruction at the end. head_fraction 1.0 is plain right truncation. A tokenizer with a chat
    template (a causal LM's) frames each prompt as its user turn followed by the generation prompt,
    the frame counted in max_length as [CLS] and [SEP] are. Training, evaluation and serving all
    encode through here (the checkpoint records head_fraction)."""
    if not 0.0 <= float(head_fraction) <= 1.0:
        raise ValueError(f"head_fraction must be in [0, 1], got {head_fraction}")
    chat = bool(getattr(tokenizer, "chat_template", None))
    # where the tokenizer puts its special tokens ([CLS] ... [SEP] for BERT; a chat LM's template
    # around a user turn, up to the generation prompt), from a probe
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    if chat:
        framed = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}], add_generation_prompt=True, tokenize=False
        )
        probe = tokenizer(framed, add_special_tokens=False)["input_ids"]
    else:
        probe = tokenizer("a")["input_ids"]
    n_pre = next((i for i in range(len(probe)) if probe[i : i + len(bare)] == bare), None)
    if n_pre is None:
        raise ValueError("the tokenizer's chat template splits a prompt's tokens: cannot frame prompts with it")
    n_post = len(probe) - n_pre - len(bare)
    body = int(max_length) - n_pre - n_post
    if body < 1:
        frame = "chat template" if chat else "special tokens"
        raise NoRoomForPrompt(
            f"max_length {max_length} leaves no room for prompt tokens: {n_pre + n_post} go to the "
            f"tokenizer's {frame}"
        )
    head = int(round(body * float(head_fraction)))
    if chat:  # the frame's ids around each prompt's own
        prefix, suffix = probe[:n_pre], probe[len(probe) - n_post :]
        bodies = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        encoded = [prefix + ids + suffix for ids in bodies]
    else:
        encoded = tokenizer(list(texts), truncation=False, verbose=False)["input_ids"]
    out = []
    for ids in encoded:
        if len(ids) > int(max_length):
            inner = ids[n_pre : len(ids) - n_post]
            ids = ids[:n_pre] + inner[:head] + inner[len(inner) - (body - head) :] + ids[len(ids) - n_post :]
        out.append(list(ids))
    return out


def padded_width(longest: int, multiple: int = 1, cap: int | None = None) -> int:
    """`longest` rounded up to a multiple of `multiple`, never beyond `cap` (nor below `longest`).
    oneDNN compiles a bfloat16 matmul kernel per input shape, so a batch width that takes every
    value up to max_length spends more time compiling than computing (benchmarks/train_throughput.py)."""
    width = -(-longest // multiple) * multiple
    return max(longest, min(width, cap)) if cap is not None else width


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int, multiple: int = 1, cap: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists to the longest of them (rounded up as `padded_width` says) ->
    (input_ids, attention_mask), both long. Training and serving batch through here (the
    tokenizer's `pad` on ids warns and is slower)."""
    width = padded_width(max(len(s) for s in seqs), multiple, cap)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[r, : len(s)] = 1
    return ids, mask
