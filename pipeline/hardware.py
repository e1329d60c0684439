"""What the machine computes natively, for settings that pick a precision (`auto` / `native`)."""

from __future__ import annotations


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX512-BF16 / AMX; oneDNN's check;
    False if unknown). Without it bfloat16 is emulated and far slower than float32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
