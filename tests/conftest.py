"""Shared fixtures: tiny random models built in the test (fast), the packaged tokenizer."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged MiniLM tokenizer (bert-base-uncased vocabulary); on disk, loads in ms."""
    from transformers import AutoTokenizer

    from pipeline.ranking.model import resolve_encoder

    return AutoTokenizer.from_pretrained(resolve_encoder("minilm-l6"))


@pytest.fixture(scope="session")
def tiny_bert_config(tokenizer):
    from transformers import BertConfig

    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)


@pytest.fixture
def tiny_ranker(tiny_bert_config):
    import torch

    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    return LengthRanker.from_config(tiny_bert_config)


@pytest.fixture
def tiny_checkpoint(tmp_path, tiny_ranker, tokenizer):
    """A random checkpoint in the export format (pars.json + weights + config + tokenizer)."""
    from pipeline.serving import save_checkpoint

    return save_checkpoint(tiny_ranker, tokenizer, tmp_path / "ckpt", method="pairwise",
                           max_length=64, encoder="tiny-random-bert")
