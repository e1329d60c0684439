"""Score prompts with an exported checkpoint: no Lightning, batched, dynamic padding."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.ranking.checkpoint import WEIGHTS, CheckpointError, read_meta

# save_pretrained of a fast BERT tokenizer writes tokenizer.json; a slow one writes vocab.txt
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
SCORE_DIRECTION = "higher_is_longer"


class Scorer:
    """Loads a checkpoint written by `save_checkpoint`; `score(texts)` -> higher = longer answer."""

    def __init__(self, model, tokenizer, meta: dict, device: str = "cpu", batch_size: int = 32):
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.meta = meta
        self.device = device
        self.batch_size = int(batch_size)
        self.max_length = int(meta["max_length"])
        self.head_fraction = float(meta.get("head_fraction", 1.0))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", batch_size: int = 32) -> "Scorer":
        """Load and validate a checkpoint dir; any defect is a CheckpointError naming the dir."""
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoTokenizer

        from pipeline.ranking.model import LengthRanker

        path = Path(path)
        meta = read_meta(path)  # missing files, unknown format version, weights hash
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise CheckpointError(f"checkpoint {path} has no tokenizer files (expected one of {TOKENIZER_FILES})")
        if meta.get("score_direction") != SCORE_DIRECTION:
            raise CheckpointError(
                f"checkpoint {path}: score_direction {meta.get('score_direction')!r} is not {SCORE_DIRECTION!r}"
            )
        if not isinstance(meta.get("max_length"), int) or meta["max_length"] < 2:
            raise CheckpointError(f"checkpoint {path}: max_length {meta.get('max_length')!r} is not a length")
        head = meta.get("head_fraction", 1.0)
        if isinstance(head, bool) or not isinstance(head, (int, float)) or not 0.0 <= head <= 1.0:
            raise CheckpointError(f"checkpoint {path}: head_fraction {head!r} is not a number in [0, 1]")
        try:
            config = AutoConfig.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = LengthRanker.from_config(config)
            model.load_state_dict(load_file(str(path / WEIGHTS)))  # strict: every tensor must match
        except Exception as exc:  # a half-written or foreign directory
            raise CheckpointError(f"checkpoint {path} could not be loaded: {exc}") from exc
        return cls(model, tokenizer, meta, device=device, batch_size=batch_size)

    def score(self, texts: Sequence[str], batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """Scores in input order, computed under inference mode.

        Prompts are tokenized once (cut to max_length head + tail, as in training), then batched in
        order of token length so each batch is padded only to its own longest prompt: on mixed
        lengths this does much less padded work than batching in input order."""
        import torch

        texts = list(texts)
        if not texts:
            return np.empty(0, dtype=np.float32)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"score: item {i} is {type(text).__name__}, not str")
        batch_size = int(batch_size or self.batch_size)
        from pipeline.ranking.model import encode_prompts, pad_batch

        ids = encode_prompts(self.tokenizer, texts, self.max_length, self.head_fraction)
        order = np.argsort([len(x) for x in ids], kind="stable")
        out = np.empty(len(texts), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="scoring", unit="batch", leave=False)
        with torch.inference_mode():
            for start in starts:
                rows = order[start : start + batch_size]
                input_ids, attention_mask = pad_batch([ids[r] for r in rows], self.pad_id)
                scores = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device))
                out[rows] = scores.float().cpu().numpy()
        return out

