"""Stage `generate@<model>`: k sampled answers per prompt -> data/generations/<model>/.

Resumable and lossless: each prompt's k answers are appended to `cache.jsonl` (one line per
prompt, flushed and fsynced) the moment they finish, keyed by (backend identity: model and
sampling settings, prompt text; for recorded answers also the reply on file). A killed run
started again skips what is cached; a line half-written at the kill, or any other damaged line,
is skipped and set aside (`cache.jsonl.damaged`) while every valid line, before or after it, is
kept, so no sample is lost or duplicated. `generations.parquet` is then rebuilt whole from the
cache for the prompts selected now.
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import hashlib
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.backends import OPTIONS, REQUIRED, PromptItem, Sample, make_backend
from pipeline.backends.vllm_backend import (
    DTYPES,
    OWN_ENGINE_ARGS,
    check_engine_args,
    model_max_positions,
)
from pipeline.contracts import (
    FINISH_REASONS,
    GENERATIONS,
    PROMPTS,
    ensure_parent,
    prompts_path,
    read_table,
    write_json,
    write_table,
)
from pipeline.encoders import resolve_encoder
from pipeline.errors import PARSError, plain_name
from pipeline.params import PARAMS_HELP, MissingParam, Section, load_params
from pipeline.sources import SourceUnavailable
from pipeline.sources.base import as_utf8

BACKENDS = ("vllm", "openai", "recorded")


class GenerationCache:
    """Append-only JSONL of finished prompts: {"key", "prompt_id", "samples": [...]}."""

    # each entry is written and flushed at once (a killed process loses nothing it wrote); fsync, for
    # a machine that loses power, at most this often: per entry it was 6 s of ChatGPT's 27k imports
    SYNC_EVERY_S = 1.0

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, dict] = {}
        self._fh = None
        self._synced = 0.0
        self._lock = self._take_lock()
        try:
            if path.exists():
                self._load()
        except BaseException:
            self.close()  # the lock too: the caller never gets this object to close
            raise

    def _take_lock(self) -> int | None:
        """One writer per cache: a second run would take the first's half-written last line for
        damage and replace the file, and the first would go on appending to the deleted one. The
        lock is on the cache's directory, not the file (_load replaces the file, so a lock on it
        would not hold) nor a lock file (the directory is a DVC out: a file left there changes its
        hash). The OS drops it when the process ends, killed or not."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PARSError(f"another pars generate is writing {self.path}; wait for it to end") from None
        except OSError as exc:  # e.g. NFS, which cannot lock a directory: run without, and say so
            os.close(fd)
            print(
                f"generate: cannot lock {self.path.parent} ({exc.strerror}); run one `pars generate` per model at a time"
            )
            return None
        return fd

    def _load(self) -> None:
        """Keep every valid line. A damaged one (a line torn by a kill, bytes that are not a JSON
        entry, an entry whose samples could not be generations rows) is skipped and counted, never
        the valid lines after it: its prompt counts as not cached (generated again), the file is
        rewritten without it (atomically) and the damaged bytes are kept in `<cache>.damaged`."""
        damaged: list[tuple[int, bytes]] = []
        good: list[bytes] = []
        with self.path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                entry = None
                if raw.endswith(b"\n"):
                    try:
                        entry = json.loads(raw)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        entry = None
                    try:  # what add() now repairs (a lone surrogate, reasoning past output), repaired here too
                        entry["samples"] = [_storable(dict(sample)) for sample in entry["samples"]]
                    except (KeyError, TypeError, ValueError, AttributeError):
                        pass  # not an entry's shape: is_entry judges it
                if not is_entry(entry):
                    damaged.append((lineno, raw))
                    continue
                self.entries[entry["key"]] = entry
                good.append(raw)
        if not damaged:
            return
        with open(f"{self.path}.damaged", "ab") as fh:
            for _, raw in damaged:
                fh.write(raw if raw.endswith(b"\n") else raw + b"\n")
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("wb") as fh:
            fh.writelines(good)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        lines = ", ".join(str(n) for n, _ in damaged[:10]) + (" …" if len(damaged) > 10 else "")
        print(
            f"generate: warning: {self.path}: skipped {len(damaged)} damaged line(s) (line {lines}), their "
            f"prompts will be generated again; kept {len(good)} valid entries; the damaged bytes are in "
            f"{self.path}.damaged",
            flush=True,
        )

    def add(self, key: str, prompt_id: str, samples: list[Sample]) -> None:
        entry = {"key": key, "prompt_id": prompt_id, "samples": [_storable(s.to_dict()) for s in samples]}
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        self._fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._fh.flush()
        if time.monotonic() - self._synced >= self.SYNC_EVERY_S:
            self.sync()
        self.entries[key] = entry

    def sync(self) -> None:
        if self._fh is not None:
            os.fsync(self._fh.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        """Flush the cache and release the lock (a later run, or a second cache object, may open it)."""
        try:
            if self._fh is not None:
                self.sync()
                self._fh.close()
                self._fh = None
        finally:  # the lock goes even when the flush fails
            if self._lock is not None:
                # LOCK_UN, not close alone: a forked child (a vLLM worker) sharing the fd would keep it
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                os.close(self._lock)
                self._lock = None


_COUNTS = ("output_tokens", "reasoning_tokens", "prompt_tokens")


def is_entry(entry: Any) -> bool:
    """Whether a cache line's JSON is an entry that can become generations rows: a key, a prompt id
    and a non-empty list of samples, each with every Sample field of the right type."""
    if not (isinstance(entry, dict) and isinstance(entry.get("key"), str) and isinstance(entry.get("prompt_id"), str)):
        return False
    samples = entry.get("samples")
    return isinstance(samples, list) and bool(samples) and all(_is_sample(s) for s in samples)


def _is_sample(sample: Any) -> bool:
    # text valid UTF-8 and reasoning <= output are _storable's work, done on every line before this check
    return (
        isinstance(sample, dict)
        # type() is int: a bool or 3.5 is not a token count; < 2**31: the int32 column
        and all(type(sample.get(f)) is int and 0 <= sample[f] < 2**31 for f in _COUNTS)
        and sample.get("finish_reason") in FINISH_REASONS
        and all(isinstance(sample.get(f), str) for f in ("text", "reasoning"))
    )


def _storable(sample: dict[str, Any]) -> dict[str, Any]:
    """`sample` as the cache's load check accepts it: text and reasoning valid UTF-8 (a backend can hand
    back lone surrogates, e.g. an endpoint's JSON "\\ud800"), and reasoning tokens no more than the output's."""
    for f in ("text", "reasoning"):
        sample[f] = as_utf8(sample[f])
    # a reasoning count past the output's (an endpoint's own figure, or a trace tokenized again) would
    # be set aside as damage at the next load and asked for again, every run: the output bounds it
    sample["reasoning_tokens"] = min(sample["reasoning_tokens"], sample["output_tokens"])
    return sample


# the temp files a killed run can leave in the model's folder: write_table's (tempfile.mkstemp: prefix
# `.<name>.`, 8 characters of tempfile's alphabet, suffix `.tmp`), write_json's and the cache rewrite's
_TABLE_TMP = re.compile(r"\.generations\.parquet\.[a-z0-9_]{8}\.tmp|\.meta\.json\.tmp|cache\.jsonl\.tmp")


def remove_leftover_temps(out_dir: Path) -> None:
    """A killed run can leave a temp file in the model's folder, which DVC keeps between runs
    (persist: true) and so would hash with the out. Called with the cache lock held: a temp file then
    is no live run's."""
    if out_dir.is_dir():
        for f in out_dir.iterdir():
            if _TABLE_TMP.fullmatch(f.name) and f.is_file():
                f.unlink()


def cache_key(identity: dict[str, Any], prompt: str) -> str:
    blob = json.dumps(identity, sort_keys=True) + "\x00" + prompt
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def select_prompts(prompts: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    """The prompts a model answers: its datasets, at most N per dataset (smallest ids first)."""
    datasets = spec.get("datasets")
    if datasets:
        made = sorted(set(prompts["dataset"]))
        unknown = sorted(set(datasets) - set(made))
        if unknown:
            close = difflib.get_close_matches(unknown[0], made, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{getattr(spec, 'where', 'generate.models.<model>')}.datasets: {unknown} are not in the prompts "
                f"file ({hint}prepare made {made})"
            )
        prompts = prompts[prompts["dataset"].isin(datasets)]
    cap = spec.get("max_prompts_per_dataset")
    prompts = prompts.sort_values("prompt_id", kind="stable")
    if cap is not None:  # check_spec made it >= 1 (head(-5) would keep all but 5)
        prompts = prompts.groupby("dataset", sort=False, group_keys=False).head(int(cap))
    return prompts.reset_index(drop=True)


def check_spec(model: str, spec: dict[str, Any], machine: bool = True) -> Section:
    """One model's entry of generate.models, checked before any backend is made: a bad value is one
    line naming `<file>: generate.models.<model>.<key>`, not a vLLM error after the engine loads.
    `machine=False` (`pars profile`) leaves out what asks this machine (a local model dir, the
    installed vLLM): a profile is switched to before the models it names are there."""
    if not isinstance(spec, Section):
        spec = Section(spec, f"generate.models.{model}")
    where = spec.where
    backend = spec.choice("backend", BACKENDS)
    # the recorded backend answers every prompt of its source's datasets: no selection keys
    selection = set() if backend == "recorded" else {"datasets", "max_prompts_per_dataset"}
    unknown = sorted(set(spec) - {"backend"} - selection - OPTIONS[backend])
    if unknown:
        raise PARSError(
            f"{where}.{unknown[0]}: not an option of the {backend} backend; its options: "
            f"{', '.join(sorted(OPTIONS[backend] | selection))}"
        )
    if backend != "recorded":
        # `model: null` would otherwise load the hub id "None"
        name = spec["model"]
        if not isinstance(name, str) or not name.strip():
            raise PARSError(f"{where}.model {name!r}: must be a model name (a local dir or a hub id, org/name)")
    check_required(spec, backend)
    datasets = spec.get("datasets")
    if datasets is not None and not (
        isinstance(datasets, list) and datasets and all(isinstance(d, str) for d in datasets)
    ):
        raise PARSError(f"{where}.datasets {datasets!r}: must be a list of dataset names, or null for all")
    integers = {
        "max_prompts_per_dataset": 1,  # or null: all (0 or -5 would mean all, or all but 5)
        "k": 1,
        "max_tokens": 1,
        "seed": 0,
        "max_num_seqs": 1,
        "max_model_len": 1,
        "tensor_parallel_size": 1,
        "concurrency": 1,
        "max_retries": 0,
    }
    for key, minimum in integers.items():
        if key in spec:
            spec.integer(key, minimum=minimum, optional=key == "max_prompts_per_dataset")
    # each backend's own knobs too (OPTIONS lets each through to its backend alone): checked here
    # they name the file and key, which the backends' own checks cannot
    for key in ("repetition_penalty", "timeout_s", "connect_timeout_s"):
        if key in spec:
            spec.number(key, positive=True)
    for key in ("temperature", "backoff_s"):
        if key in spec:
            spec.number(key, minimum=0)
    for key in ("engine_args", "extra_body"):  # passed through to vLLM / the request as keyword arguments
        if key in spec and not isinstance(spec[key], dict):
            raise PARSError(f"{where}.{key} {spec[key]!r}: must be a mapping of keys to values")
    for key in ("top_p", "gpu_memory_utilization"):
        if key in spec:
            spec.number(key, positive=True, maximum=1)
    if backend == "vllm":
        check_vllm_spec(spec, machine)
    if backend == "openai":
        check_openai_spec(spec)
    if backend == "recorded":
        check_recorded_source(spec)
    return spec


def check_required(spec: Section, backend: str) -> None:
    """The settings that decide the answers (REQUIRED) must be in the model's own entry: the backends
    have no default for them, so an entry that leaves one out is refused here, in one line naming the
    file and key, rather than run with a number nobody chose there."""
    missing = [key for key in REQUIRED[backend] if key not in spec]
    if missing:
        also = f"; also missing: {', '.join(missing[1:])}" if missing[1:] else ""
        raise MissingParam(
            f"{spec.where}.{missing[0]} is missing: it decides the answers and has no default (the {backend} "
            f"backend needs {', '.join(REQUIRED[backend])} in each model's entry){also}"
        )


def check_openai_spec(spec: Section) -> None:
    """The openai backend's text keys (check_spec has checked its numbers)."""
    where = spec.where
    url = spec["base_url"]
    if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise PARSError(f"{where}.base_url {url!r}: must be an http:// or https:// URL")
    for key in ("max_tokens_field", "api_key_env"):  # a request field's name, an environment variable's
        if key in spec and not (isinstance(spec[key], str) and spec[key].strip()):
            raise PARSError(f"{where}.{key} {spec[key]!r}: must be a non-empty string")


def check_recorded_source(spec: Section) -> None:
    """`source`, as the recorded backend reads it, before any work: a bad one names its key."""
    from pipeline.backends.recorded import parse_sources

    try:
        parse_sources(spec["source"])
    except ValueError as exc:
        raise PARSError(f"{spec.where}.{exc}") from None


def check_vllm_spec(spec: Section, machine: bool) -> None:
    """The vllm backend's own keys (check_spec has checked the shared ones)."""
    where = spec.where
    spec.choice("dtype", DTYPES)
    if "enforce_eager" in spec and not isinstance(spec["enforce_eager"], bool):  # bool("no") is True
        raise PARSError(f"{where}.enforce_eager {spec['enforce_eager']!r}: must be true or false")
    if "cpu_kv_cache_gib" in spec:  # whole GiB: vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer
        spec.integer("cpu_kv_cache_gib", minimum=1)
    engine_args = spec.get("engine_args") or {}
    for key in OWN_ENGINE_ARGS:
        if key in engine_args:
            raise PARSError(f"{where}.engine_args.{key}: set {where}.{key} instead (the backend sets it)")
    # max_model_len holds the prompt and the answer: the answer must fit it
    max_len = spec["max_model_len"]
    if spec["max_tokens"] >= max_len:
        raise PARSError(
            f"{where}.max_tokens {spec['max_tokens']}: must be below max_model_len ({max_len}), "
            "which holds the prompt and the answer"
        )
    if not machine:
        return
    path = spec["model"]
    # a hub id is `name` or `org/name`; anything else is a local dir, which must be there now, and
    # so is `dir/name` when `dir` is a local directory (`models/x` means this checkout's models/)
    local = path.startswith(("/", ".", "~")) or path.count("/") > 1 or ("/" in path and Path(path).parent.is_dir())
    if local and not Path(path).expanduser().exists():
        raise PARSError(
            f"{where}.model {path}: no such directory (a local model dir must exist: run the stage that "
            "writes it, e.g. `dvc repro materialize`; or give a hub id, org/name)"
        )
    # vLLM refuses a max_model_len beyond the model's positions, but only once the engine starts;
    # a hub model's config is not read here (no download before the engine), nor one whose context
    # engine_args may stretch (hf_overrides with rope scaling)
    stretched = any(k in engine_args for k in ("hf_overrides", "rope_scaling", "rope_theta"))
    local_dir = Path(path).expanduser().is_dir() and not stretched
    positions = model_max_positions(Path(path).expanduser()) if local_dir else None
    if (
        positions is not None
        and max_len > positions
        and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") in (None, "", "0")
    ):
        raise PARSError(
            f"{where}.max_model_len {max_len}: the model has "
            f"{positions} positions ({path}/config.json max_position_embeddings); set max_model_len <= {positions}"
        )
    check_engine_args(engine_args, where)


def check_params(params: Section, machine: bool = True) -> None:
    """The generate section as `pars profile` checks it: its keys and every model's entry (the stage
    itself checks the entry it runs, in run)."""
    models = models_of(params)
    for model in models:
        check_spec(str(model), models.mapping(model), machine=machine)


def models_of(params: Section) -> Section:
    """generate.models, the section's keys checked, and the models' names: each names
    <out-root>/<model>/ and <metrics>/<model>.json, so `../x` would write outside them."""
    models = params.only(("models", "recorded_tokenizer")).mapping("models")
    for name in models:
        if not plain_name(name):
            raise PARSError(
                f"{models.where}.{name}: the key {name!r} must be a plain name (text, no / or \\, not . or ..): "
                "it names the model's output folder and metrics file"
            )
    return models


def _progress(total: int, model: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"generate {model}", unit="prompt", dynamic_ncols=True)


def run(
    model: str,
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    out_dir: Path,
    recorded_tokenizer: str | None = None,
    run_stats_path: Path | None = None,
) -> dict[str, Any]:
    """Answer the selected prompts that are not cached yet and rewrite the outputs; returns meta.json's
    content plus `this_run` (this run's counts and speed), which is written to `run_stats_path`
    instead of meta.json so that the stage's outputs depend on its inputs alone (a re-run that
    changes nothing leaves their DVC hashes, and so the stages downstream, as they were)."""
    spec = check_spec(model, spec)
    where, backend_name = spec.where, spec["backend"]
    if backend_name == "recorded" and recorded_tokenizer is not None:  # else the backend names it missing
        spec = {**spec, "recorded_tokenizer": recorded_tokenizer}
    backend = make_backend(backend_name, spec)
    if hasattr(backend, "select"):  # the recorded backend: every prompt of its source's datasets
        try:
            selected = backend.select(prompts)
        except (SourceUnavailable, ValueError) as exc:  # a package missing, a dataset prepare did not load
            raise PARSError(f"{where}.source: {exc}") from None
    else:
        selected = select_prompts(prompts, spec)
    if selected.empty:
        skipped = getattr(backend, "skipped", {})
        if skipped:  # the recorded backend's: no reply on file for any prompt of its datasets
            pid, reason = next(iter(skipped.items()))
            raise PARSError(
                f"{where}: no prompts selected for model {model!r}: the {backend_name} backend skipped "
                f"{len(skipped)} prompt(s), e.g. {pid}: {reason}"
            )
        hint = "" if hasattr(backend, "select") else f" (check {where}.datasets)"  # recorded has no datasets key
        raise PARSError(f"no prompts selected for model {model!r}{hint}")
    cache = GenerationCache(out_dir / "cache.jsonl")  # refuses a second run on this cache
    try:
        return _run_locked(model, backend, selected, cache, out_dir, run_stats_path)
    finally:
        cache.close()


def _run_locked(model, backend, selected, cache, out_dir, run_stats_path) -> dict[str, Any]:
    """run's work with the cache open and locked until the outputs are written: a second run can
    neither remove this one's temp file nor write the outputs in between."""
    if cache._lock is not None:  # without the lock (NFS) a temp file may be another run's
        remove_leftover_temps(out_dir)
    identity = backend.identity()
    keys = {r.prompt_id: cache_key(identity, backend.cache_text(r)) for r in selected.itertuples()}
    # an entry under this key with another number of samples than k (a hand-edited or foreign line)
    # is not these answers: generated again, and said
    k = identity.get("k")
    short = [
        pid
        for pid, key in keys.items()
        if key in cache.entries and k is not None and len(cache.entries[key]["samples"]) != k
    ]
    for key in {keys[pid] for pid in short}:  # one text in two datasets: one key for both ids
        del cache.entries[key]
    if short:
        print(
            f"generate {model}: warning: {len(short)} cached entr{'y' if len(short) == 1 else 'ies'} in "
            f"{cache.path} with a number of samples other than k={k} (e.g. prompt {short[0]}): generated again"
        )
    todo = [
        PromptItem(r.prompt_id, r.prompt, r.dataset, r.source_id)
        for r in selected.itertuples()
        if keys[r.prompt_id] not in cache.entries
    ]
    print(f"generate {model}: {len(selected)} prompts, {len(selected) - len(todo)} already cached, {len(todo)} to do")

    t0, new_tokens = time.perf_counter(), 0
    if todo:
        backend.start()
        t0 = time.perf_counter()
        bar = _progress(len(todo), model)
        try:
            for pid, samples in backend.generate(todo):
                cache.add(keys[pid], pid, samples)
                new_tokens += sum(s.output_tokens for s in samples)
                bar.update(1)
                # refresh=False: the bar redraws at its own rate (every call would print 40k lines)
                bar.set_postfix(tok_s=f"{new_tokens / max(time.perf_counter() - t0, 1e-9):.0f}", refresh=False)
        finally:
            bar.close()
            backend.close()
    wall = time.perf_counter() - t0

    rows = []
    for pid in selected["prompt_id"]:
        entry = cache.entries.get(keys[pid])
        if entry is None:
            continue  # skipped by the backend (e.g. oversized); reported in meta.json
        for i, s in enumerate(entry["samples"]):
            rows.append({"prompt_id": pid, "sample": i, **s})
    skipped = getattr(backend, "skipped", {})
    if not rows:
        first = next(iter(skipped.items()), None)
        raise ValueError(
            f"model {model!r}: no answers were produced"
            + (f"; {len(skipped)} prompt(s) skipped, e.g. {first[0]}: {first[1]}" if first else "")
        )
    df = pd.DataFrame(rows)
    write_table(df, out_dir / "generations.parquet", GENERATIONS)
    meta = {
        **backend.describe(),
        "generation_model": model,
        "prompts": int(df["prompt_id"].nunique()),
        "samples": len(df),
        "skipped_prompts": len(skipped),
        "skipped": dict(list(skipped.items())[:50]),
    }
    write_json(meta, out_dir / "meta.json")
    this_run = {
        "generation_model": model,
        "prompts_generated": len(todo) - len([p for p in todo if p.prompt_id in skipped]),
        "prompts_cached": len(selected) - len(todo),
        "output_tokens": new_tokens,
        "wall_s": round(wall, 1),
        "tokens_per_s": round(new_tokens / wall, 1) if wall > 0 and new_tokens else None,
        "python": platform.python_version(),
    }
    if run_stats_path is not None:
        write_json(this_run, run_stats_path)
    print(
        f"generate {model}: {meta['prompts']} prompts, {len(df)} samples -> {out_dir}"
        + (f"; {len(skipped)} prompts skipped (see meta.json)" if skipped else "")
    )
    return meta | {"this_run": this_run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars generate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a key of generate.models in params.yaml")
    parser.add_argument("--prompts", default=str(prompts_path()), help="the prompts table (default: %(default)s)")
    parser.add_argument(
        "--out-root", default="data/generations", help="generations root, <model>/... (default: %(default)s)"
    )
    parser.add_argument("--params", default=None, help=PARAMS_HELP)
    parser.add_argument(
        "--metrics", default="metrics/generate", help="where <model>.json (this run's counts and speed) goes"
    )
    args = parser.parse_args(argv)
    params = load_params("generate", args.params)
    models = models_of(params)
    if args.model not in models:
        raise KeyError(f"model {args.model!r} is not in generate.models (have {sorted(map(str, models))})")
    spec = models.mapping(args.model)  # checked by run, before the backend is made
    # outputs under a file: one line now, not after the backend has run
    ensure_parent(Path(args.out_root) / args.model / "generations.parquet", create=False)
    ensure_parent(Path(args.metrics) / f"{args.model}.json", create=False)
    recorded_tokenizer = None
    if spec.get("backend") == "recorded":  # counts the recorded answers' tokens; a mistyped name: one line, now
        recorded_tokenizer = params["recorded_tokenizer"]
        if not isinstance(recorded_tokenizer, str) or not recorded_tokenizer.strip():
            raise PARSError(
                f"{params.where}.recorded_tokenizer {recorded_tokenizer!r}: name the tokenizer that counts the "
                "recorded answers' tokens (an encoder name such as minilm-l6, or a tokenizer directory)"
            )
        resolve_encoder(recorded_tokenizer, key=f"{params.where}.recorded_tokenizer")
    prompts = read_table(args.prompts, PROMPTS)
    run(
        args.model,
        spec,
        prompts,
        Path(args.out_root) / args.model,
        recorded_tokenizer=recorded_tokenizer,
        run_stats_path=Path(args.metrics) / f"{args.model}.json",
    )
    return 0
