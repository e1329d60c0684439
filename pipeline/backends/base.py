"""What every backend shares: the sample record, the prompt item, reasoning splitting."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

# DeepSeek-R1-style traces. Some chat templates open <think> in the prompt, so the answer
# may hold only the closing tag: everything before it is then the trace. Only then: a plain answer
# that merely mentions "</think>" has no trace.
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*(.*)$", re.DOTALL)
_THINK_OPENED = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*(.*)$", re.DOTALL)


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str]:
    """(reasoning, answer) from a generated text; reasoning is '' when there is no trace.

    A trace that never closes (cut at max_tokens, or a model that stopped inside it) is all
    reasoning and no answer: the text opens <think>, or the prompt did (`opened`: the chat
    template ends with <think>). A bare closing tag ends a trace only when `opened`."""
    match = (_THINK_OPENED if opened else _THINK).match(text)
    if match:
        return match.group(1).strip(), match.group(2)
    head = text.lstrip()
    if head.startswith("<think>"):
        return head[len("<think>") :].strip(), ""
    if opened:
        return text.strip(), ""
    return "", text


def require(spec: Any, keys: Iterable[str], backend: str) -> None:
    """Each of `keys` must be in `spec` (a backend made without generate's check_spec, as benchmarks
    and tests make them): one ValueError naming every missing key, never a default in its place."""
    missing = [key for key in keys if key not in spec]
    if missing:
        raise ValueError(
            f"{backend} backend: params need {', '.join(f'`{key}`' for key in missing)} (settings that "
            "decide the answers have no default in code)"
        )


@dataclass
class PromptItem:
    prompt_id: str
    prompt: str
    dataset: str = ""
    source_id: str = ""


@dataclass
class Sample:
    output_tokens: int  # every generated token, reasoning trace included
    reasoning_tokens: int
    finish_reason: str  # "stop" or "length" (cut: normalise_finish_reason)
    prompt_tokens: int
    text: str  # the answer, trace removed
    reasoning: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# finish reasons of an answer that was cut: at max_tokens, by a content filter (OpenAI's
# content_filter), or aborted (vLLM's abort); its length is a lower bound (pairs' censoring rule)
CUT_REASONS = frozenset({"length", "content_filter", "abort"})


def normalise_finish_reason(reason: str | None) -> str:
    """The contract's reason: "length" for an answer that was cut (CUT_REASONS), else "stop"."""
    return "length" if reason in CUT_REASONS else "stop"


class Backend:
    """Interface. `identity()` keys the resume cache: change it and answers are regenerated."""

    name = ""

    def identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What meta.json records: model, sampling, tokenizer, versions."""
        return self.identity()

    def cache_text(self, row) -> str:
        """The text that, with `identity()`, keys a selected prompt row (prompt_id, dataset,
        source_id, prompt) in the resume cache: the prompt. A backend whose answer depends on more
        than the prompt puts that in too (the recorded one: its reply on file)."""
        return row.prompt

    def start(self) -> None:
        """Load what is slow to load (an engine), so throughput figures exclude it."""

    def generate(self, items: Iterable[PromptItem]) -> Iterator[tuple[str, list[Sample]]]:
        raise NotImplementedError

    def close(self) -> None:
        pass
