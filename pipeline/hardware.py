"""What the machine computes natively, for settings that pick a precision (`auto` / `native`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX512-BF16 / AMX; oneDNN's check;
    False if unknown). Without it bfloat16 is emulated and far slower than float32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_is_native(device_type: str) -> bool:
    """Whether a `device_type` ('cpu', 'cuda', ...) computes bfloat16 natively: a CPU with
    AVX512-BF16 / AMX, a GPU that supports it without emulation (torch counts a pre-Ampere GPU's
    emulated bf16 as support by default: far slower than float32). Anything else: False."""
    if device_type == "cuda":
        import torch

        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device_type == "cpu" and cpu_has_native_bf16()


def auto_precision(device_type: str) -> str:
    """What a precision of `auto` means on `device_type`: bf16-mixed where bfloat16 is native,
    else 32-true (emulated bfloat16 is many times slower than float32)."""
    return "bf16-mixed" if bf16_is_native(device_type) else "32-true"


DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"  # the scorer's devices a setting may name


def resolve_device(device: str) -> str:
    """A scorer's torch device: `auto` is cuda where a GPU is visible, else cpu. ValueError for a GPU
    this machine does not have (else torch fails deep in the first checkpoint's load)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; else what platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What a timing was measured on: figures from different machines do not compare (an AVX2-only
    CPU runs the same engine and training several times slower than one with AVX512-BF16)."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "native_bf16": cpu_has_native_bf16()}
