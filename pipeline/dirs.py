"""Directories written whole: checkpoints and materialized models are swapped in by renames, so a
killed run never leaves one half written or the old one half deleted. Low level on purpose (the
standard library only), so that stages and libraries of any layer can share it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def umask() -> int:
    try:  # Linux: read it without setting it (setting it, even briefly, races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share(path: str | Path) -> None:
    """Give a file the mode any new file gets (0644 under the usual umask 022). Writers that make
    their files 0600 (mkstemp, safetensors) would keep outputs shared through a DVC cache from the team."""
    os.chmod(path, 0o666 & ~umask())


def replace_dir(dst: str | Path, fill: Callable[[Path], Any]) -> Path:
    """Replace the directory `dst` whole: `fill(tmp)` creates and writes a temp sibling, which then
    takes `dst`'s place by rename. A reader never finds a half-written `dst` (one that validates but
    lacks a file written last); if `fill` raises, `dst` is untouched and the temp dir removed."""
    dst = Path(dst)
    tmp, old = dst.with_name(f".{dst.name}.tmp"), dst.with_name(f".{dst.name}.old")
    for leftover in (tmp, old):  # left by a run that was killed
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        fill(tmp)
        for path in tmp.rglob("*"):
            if path.is_file() and not path.is_symlink():
                share(path)
        # renames only: the old directory moves aside whole, so no moment leaves it half deleted
        if dst.exists():
            dst.rename(old)
        tmp.rename(dst)
    except BaseException:
        if old.exists() and not dst.exists():  # the second rename failed: put the old one back
            old.rename(dst)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return dst
