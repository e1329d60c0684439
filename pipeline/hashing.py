"""sha256 of files read in chunks: checkpoints (their weights and files) and generation models (the
cache key of a local model). Low level on purpose, so that stages of any layer can share it."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 22  # 4 MiB: a model of gigabytes is read without holding it in memory


def update_from_file(digest, path: str | Path) -> None:
    """Feed a file's bytes to `digest` (a hashlib object), chunk by chunk."""
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    update_from_file(digest, path)
    return digest.hexdigest()
