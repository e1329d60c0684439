"""Import the torchvision that scripts/fetch_vllm_tests.py puts on the conformance run's PYTHONPATH.

It is PyPI's build for torch 2.13.0, a CUDA build: its C++ ops (_C.so) do not load beside the CPU
torch, and torchvision 0.28 then fails at import, registering fake kernels for two of those ops
(nms, qnms) without checking they exist. vLLM's llava and Qwen2.5-VL processors need only its image
transforms, which are plain torch: declare the two ops' schemas (no kernel, so calling one raises)
and import again. Used by the pytest plugin and by sitecustomize.py (vLLM's child Pythons).
"""

from __future__ import annotations

import sys

_ops = None  # the torch.library.Library declaring the ops (kept alive while it is used)


def import_torchvision() -> bool:
    """Whether torchvision's image transforms import (after the fix where it is needed)."""
    try:
        import torchvision.transforms.v2  # noqa: F401

        return True
    except ImportError:
        return False
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            return False
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-done first import
    global _ops
    _ops = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _ops.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    try:
        import torchvision.transforms.v2  # noqa: F401, F811
    except Exception:
        return False
    return True
