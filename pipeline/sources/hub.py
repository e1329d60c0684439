"""Production sources from the Hugging Face hub (the paper's four datasets).

They need network (or a warm `datasets` cache); offline they fail with a clear message naming
the dataset. Records are streamed, but a cap does not shorten the download: prepare keeps the
`cap` prompts with the smallest ids, so it reads every record of the dataset first (LMSYS-Chat-1M:
about a million conversations). Only a source's `limit` (prepare.sources.<name>.limit) stops the
stream early, after the first `limit` records in the dataset's order (before dedupe and the cap)."""

from __future__ import annotations

import itertools
from typing import Iterator

from pipeline.sources.base import RawRecord, Source, SourceUnavailable


class HubSource(Source):
    repo: str = ""
    text_fields: tuple[str, ...] = ("instruction",)

    def __init__(
        self, repo: str | None = None, split: str = "train", limit: int | None = None, revision: str | None = None
    ):
        self.repo = repo or self.repo
        self.split = split
        self.revision = revision  # a commit, tag or branch of the dataset repo: the same prompts on every re-run
        # records to stream before dedupe/cap (None: all); 0 would silently mean all
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{self.name} source: limit {limit!r} must be a whole number >= 1, or None for all")
        self.limit = limit

    def _stream(self):
        try:
            import datasets

            ds = datasets.load_dataset(self.repo, split=self.split, streaming=True, revision=self.revision)
        except Exception as exc:  # offline, gated, renamed: all end the same way for the user
            raise SourceUnavailable(
                f"hub dataset {self.repo!r} ({self.name}) could not be loaded: {exc.__class__.__name__}: {exc}. "
                f"It needs network access (and for gated datasets `huggingface-cli login`), or use the "
                f"offline sources (arena_hard, alpaca_eval, sharegpt, humaneval)"
            ) from exc
        return itertools.islice(ds, self.limit) if self.limit is not None else ds

    def text(self, rec: dict) -> str | None:
        parts = [rec.get(f) for f in self.text_fields]
        if not isinstance(parts[0], str):
            return None
        return "\n\n".join(p for p in parts if isinstance(p, str) and p.strip())

    def records(self) -> Iterator[RawRecord]:
        for index, rec in enumerate(self._stream()):
            text = self.text(rec)
            yield RawRecord(str(rec.get("id", index)), text, {}, None if text is not None else "missing_text")


class Alpaca(HubSource):
    name, repo, text_fields = "alpaca", "tatsu-lab/alpaca", ("instruction", "input")


class Lmsys(HubSource):
    """LMSYS-Chat-1M (gated): the first user turn of each conversation."""

    name, repo = "lmsys", "lmsys/lmsys-chat-1m"

    def text(self, rec: dict) -> str | None:
        for turn in rec.get("conversation") or []:
            if turn.get("role") == "user" and isinstance(turn.get("content"), str):
                return turn["content"]
        return None

    def records(self) -> Iterator[RawRecord]:
        for index, rec in enumerate(self._stream()):
            text = self.text(rec)
            yield RawRecord(
                str(rec.get("conversation_id", index)), text, {}, None if text is not None else "missing_text"
            )


class MathPlus(HubSource):
    name, repo = "math", "TIGER-Lab/MATH-plus"


class CodeAlpaca(HubSource):
    name, repo = "codealpaca", "theblackcat102/evol-codealpaca-v1"


HUB_SOURCES = {cls.name: cls for cls in (Alpaca, Lmsys, MathPlus, CodeAlpaca)}
