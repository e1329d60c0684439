"""What the machine computes natively, for settings that pick a precision (`auto` / `native`)."""

from __future__ import annotations

import os
import platform
import re
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


TORCH_DEVICES = r"cpu|mps|cuda(:\d+)?"  # the torch devices a scorer runs on


def resolve_device(device: str) -> str:
    """A scorer's torch device as this machine has it: `auto` is cuda where a GPU is visible, else cpu.
    ValueError, naming what is wrong, for anything else than TORCH_DEVICES or a device this machine
    lacks (meta, cpu:7 or a missing GPU would otherwise fail deep in torch, at the first load or score)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str) or not re.fullmatch(TORCH_DEVICES, device):
        raise ValueError(f"{device!r} is not a torch device the scorer runs on (cpu, cuda, cuda:N or mps)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("is 'mps' but torch sees no Apple GPU")
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"is {device!r} but torch sees no CUDA device")
        if ":" in device and int(device.split(":")[1]) >= count:
            raise ValueError(f"is {device!r} but torch sees {count} CUDA device(s) (cuda:0..{count - 1})")
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
