"""The `recorded` backend: answers that already exist, imported as generations (one sample).

`source: "<dataset>:<answer model>"`, e.g. `arena_hard:o3-mini-2025-01-31`, or a list of them (one
model's answers from several datasets, e.g. ShareGPT's first and later turns). The answers ship
as text, so lengths are counted with one documented tokenizer (`generate.recorded_tokenizer`,
default the packaged bert-base-uncased WordPiece of MiniLM) for prompt and answer alike. A
hidden reasoning trace (o3-mini's) is not in the file and so cannot be counted: meta.json says so.

A recorded reply with no visible text (ShareGPT holds 80 ChatGPT replies that are empty or a lone
zero-width space, to prompts asking for essays and code) is a failed reply, not a 0-token answer:
its prompt is left out for that model and listed in meta.json's `skipped`, as is a prompt the
model has no recorded reply to.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Iterator

import pandas as pd

from pipeline.backends.base import Backend, PromptItem, Sample, require, split_reasoning
from pipeline.sources import SOURCES, get_source
from pipeline.sources.base import normalise

# characters that render as nothing: a reply made only of these (and whitespace) is blank
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))


def is_blank(text: str) -> bool:
    return not text.translate(_INVISIBLE).strip()


def parse_sources(source: Any) -> list[tuple[str, str]]:
    """`source` ('<dataset>:<answer model>' or a list of them) as (dataset, answer model) pairs, each a
    source that ships that model's answers; else one ValueError line starting `source <the bad item>`."""
    pairs = []
    for one in source if isinstance(source, list) and source else [source]:
        dataset, _, answer_model = one.partition(":") if isinstance(one, str) else ("", "", "")
        if not (dataset and answer_model):
            raise ValueError(
                f"source {one!r}: must be '<dataset>:<answer model>' or a list of them, e.g. sharegpt:chatgpt"
            )
        if answer_model not in getattr(SOURCES.get(dataset), "answer_models", ()):
            known = sorted(f"{name}:{m}" for name, cls in SOURCES.items() for m in cls.answer_models)
            raise ValueError(f"source {one!r}: no source ships these answers (known: {', '.join(known)})")
        pairs.append((dataset, answer_model))
    return pairs


class RecordedBackend(Backend):
    name = "recorded"

    def __init__(self, spec: dict[str, Any]):
        self.source = spec.get("source", "")  # as given: a single source keeps its identity (and cache keys)
        self.sources = parse_sources(self.source)
        require(spec, ["recorded_tokenizer"], self.name)  # it decides the token counts: no default here
        self.tokenizer_name = spec["recorded_tokenizer"]
        self._answers: dict[tuple[str, str, str], str] | None = None
        self._tokenizer = None
        self.skipped: dict[str, str] = {}

    def identity(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "source": self.source,
            "k": 1,
            "tokenizer": self.tokenizer_name,
        }

    def describe(self) -> dict[str, Any]:
        return {
            **self.identity(),
            "note": "answers imported from the source's recorded answer file; "
            "token counts use the tokenizer named here; hidden reasoning traces are not counted",
        }

    def answers(self) -> dict[tuple[str, str, str], str]:
        """(dataset, source_id, prompt as stored) -> the recorded answer text. The prompt is part of
        the key because ids repeat: ShareGPT has 123 ids shared by two conversations with
        different first turns and replies, and which of them an id alone finds depends on order."""
        if self._answers is None:
            self._answers = {}
            for dataset, answer_model in self.sources:  # parse_sources: each ships answer_model's answers
                for r in get_source(dataset).records():
                    if answer_model in r.answers and isinstance(r.prompt, str):
                        self._answers[(dataset, r.source_id, normalise(r.prompt))] = r.answers[answer_model]
        return self._answers

    def select(self, prompts: pd.DataFrame) -> pd.DataFrame:
        datasets = [dataset for dataset, _ in self.sources]
        mine = prompts[prompts["dataset"].isin(datasets)]
        missing = [d for d in datasets if d not in set(mine["dataset"])]
        if missing:
            raise ValueError(f"recorded backend: no prompts of dataset {missing[0]!r} (is it in prepare.sources?)")
        answers = self.answers()
        keys = list(zip(mine["dataset"], mine["source_id"], mine["prompt"]))
        has = [key in answers for key in keys]
        for pid, key, found in zip(mine["prompt_id"], keys, has):
            if not found:
                self.skipped[pid] = "no recorded reply of this model to this prompt"
            elif is_blank(answers[key]):
                self.skipped[pid] = "recorded reply is blank (a failed reply, not a 0-token answer)"
        usable = [pid not in self.skipped for pid in mine["prompt_id"]]
        return mine[usable].reset_index(drop=True)

    def cache_text(self, row) -> str:
        """The generation cache's key text for a selected prompt row: the prompt and a digest of its
        reply on file. A reply that changes (a source fixed, the lookup by id and prompt corrected)
        is imported again instead of reusing the old entry, as a cold run would."""
        answer = self.answers()[(row.dataset, row.source_id, row.prompt)]
        return row.prompt + "\x00reply:" + hashlib.sha256(answer.encode("utf-8")).hexdigest()[:16]

    def _count(self, texts: list[str]) -> list[int]:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from pipeline.encoders import resolve_encoder

            self._tokenizer = AutoTokenizer.from_pretrained(resolve_encoder(self.tokenizer_name))
            self._tokenizer.model_max_length = 10**9  # counting only: no truncation warning
        return [len(ids) for ids in self._tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def generate(self, items: Iterable[PromptItem]) -> Iterator[tuple[str, list[Sample]]]:
        answers = self.answers()
        items = list(items)
        for start in range(0, len(items), 256):
            batch = items[start : start + 256]
            split = [split_reasoning(answers[(it.dataset, it.source_id, it.prompt)]) for it in batch]
            n_prompt = self._count([it.prompt for it in batch])
            n_answer = self._count([answer for _, answer in split])
            n_reason = self._count([reasoning for reasoning, _ in split])
            for it, (reasoning, answer), p, a, r in zip(batch, split, n_prompt, n_answer, n_reason):
                yield (
                    it.prompt_id,
                    [
                        Sample(
                            output_tokens=a + r,
                            reasoning_tokens=r,
                            finish_reason="stop",
                            prompt_tokens=p,
                            text=answer,
                            reasoning=reasoning,
                        )
                    ],
                )
