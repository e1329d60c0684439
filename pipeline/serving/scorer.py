"""Score prompts with an exported checkpoint: no Lightning, batched, dynamic padding."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.ranking.checkpoint import WEIGHTS, CheckpointError, read_meta


class Scorer:
    """Loads a checkpoint written by `save_checkpoint`; `score(texts)` -> higher = longer answer."""

    def __init__(self, model, tokenizer, meta: dict, device: str = "cpu", batch_size: int = 32):
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.meta = meta
        self.device = device
        self.batch_size = batch_size
        self.max_length = int(meta["max_length"])

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", batch_size: int = 32) -> "Scorer":
        import torch  # noqa: F401  (imported here so `pipeline.serving` stays light)
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoTokenizer

        from pipeline.ranking.model import LengthRanker

        path = Path(path)
        meta = read_meta(path)
        try:
            config = AutoConfig.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = LengthRanker.from_config(config)
            state = load_file(str(path / WEIGHTS))
            model.load_state_dict(state)
        except CheckpointError:
            raise
        except Exception as exc:  # a half-written or foreign directory
            raise CheckpointError(f"checkpoint {path} could not be loaded: {exc}") from exc
        return cls(model, tokenizer, meta, device=device, batch_size=batch_size)

    def score(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Scores in batches; each batch padded only to its longest prompt (truncated to max_length)."""
        import torch

        texts = list(texts)
        batch_size = batch_size or self.batch_size
        out = np.empty(len(texts), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                chunk = texts[start : start + batch_size]
                enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length,
                                     return_tensors="pt")
                enc = {k: v.to(self.device) for k, v in enc.items()}
                out[start : start + len(chunk)] = self.model(**enc).float().cpu().numpy()
        return out
