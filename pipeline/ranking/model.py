"""The plain predictor: a Hugging Face encoder's [CLS] vector and a linear head, one score
per prompt, higher = longer answer. No Lightning here: export and serving use this module alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from pipeline.encoders import resolve_encoder


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
