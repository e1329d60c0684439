"""The export contract: a self-describing checkpoint directory for serving.

model.safetensors   encoder + head weights (the LengthRanker state dict)
config.json         the encoder's Hugging Face config
tokenizer files     whatever the tokenizer's save_pretrained writes
pars.json           format version, method, score direction, max length, head fraction, encoder,
                    training data, test tau_b, sha256 of model.safetensors and of every file above
                    (`files_sha256`; export re-lists them with the files added after training)
lexical files       (optional) a TF-IDF + ridge model whose prediction is added to the encoder's
                    score: pars.json `lexical` says with which weights (see `attach_lexical`)
decoder/            (optional) a frozen causal LM + a head (ridge or pairwise) whose prediction is added to the score
                    above: pars.json `decoder` says which layers, how many tokens, which weights
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.dirs import replace_dir
from pipeline.errors import plain_name
from pipeline.hashing import sha256_file

FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
META = "pars.json"
# pars.json key written by export: {"median": the checkpoint's median score on the val prompts, ...}
TYPICAL_SCORE = "typical_score"
CONFIG = "config.json"
# pars.json key: sha256 of every other file of the checkpoint dir (the loader checks each): a changed
# config.json or tokenizer file would load silently and score differently
FILES_SHA256 = "files_sha256"
# pars.json key: the lexical model added to the encoder's score (train's lexical prior, or the
# blend stage); serving computes encoder_weight * encoder score + lexical_weight * lexical prediction
LEXICAL = "lexical"
# pars.json key: a decoder prior added last (the blend stage with `features: decoder`); serving
# computes score_weight * (the score above) + decoder_weight * the decoder head's prediction
# (`head`: ridge or pairwise; a record without it is a ridge)
DECODER = "decoder"


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be served: missing, incomplete, unknown or corrupt."""


def save_checkpoint(
    model,
    tokenizer,
    out_dir: str | Path,
    *,
    method: str,
    max_length: int,
    encoder: str,
    trained_on: dict[str, Any] | None = None,
    head_fraction: float = 1.0,
    test_tau_b: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write `model` (a LengthRanker) and its tokenizer as a serving checkpoint."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS))
    model.encoder.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    files = file_hashes(out)
    meta = {
        "format_version": FORMAT_VERSION,
        "method": method,
        "score_direction": "higher_is_longer",
        "max_length": int(max_length),
        # a prompt longer than max_length keeps this share of its tokens from the start, the rest
        # from the end (pipeline.ranking.model.encode_prompts); absent in older checkpoints = 1.0
        "head_fraction": float(head_fraction),
        "encoder": encoder,
        "trained_on": trained_on or {},
        "test_tau_b": test_tau_b,
        "weights_sha256": files[WEIGHTS],
        FILES_SHA256: files,
        # how the encoder's output becomes one vector (LengthRanker.pooling): written when it is not
        # the paper's [CLS], so cls checkpoints stay as they were (absent = cls)
        **({"pooling": model.pooling} if model.pooling != "cls" else {}),
        **(extra or {}),
    }
    (out / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file under a checkpoint directory but its pars.json, by relative path."""
    return {
        f.relative_to(directory).as_posix(): sha256_file(f)
        for f in sorted(directory.rglob("*"))
        if f.is_file() and f != directory / META
    }


def read_meta(path: str | Path, verify_hash: bool = True) -> dict[str, Any]:
    """Validate a checkpoint directory and return its pars.json, or raise CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not (path / META).is_file():
        # a parent of checkpoints (models/export, models/chatgpt) is an easy slip: name what it holds
        inside = sorted(p.parent.as_posix() for p in [*path.glob(f"*/{META}"), *path.glob(f"*/*/{META}")])
        hint = f"; checkpoints inside it: {', '.join(inside[:6])}{', ...' if len(inside) > 6 else ''}" if inside else ""
        raise CheckpointError(f"checkpoint {path} is missing {META}{hint}")
    for name in (WEIGHTS, CONFIG):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: {META} is not valid JSON ({exc})") from exc
    except RecursionError:
        raise CheckpointError(f"checkpoint {path}: {META} is not valid JSON (nested too deeply)") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {path}: {META} holds a JSON {type(meta).__name__}, not an object")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: format_version {version!r} is not supported (this build reads {FORMAT_VERSION})"
        )
    if verify_hash:
        actual = sha256_file(path / WEIGHTS)
        if actual != meta.get("weights_sha256"):
            raise CheckpointError(
                f"checkpoint {path}: {WEIGHTS} sha256 {actual[:12]}… does not match pars.json "
                f"({str(meta.get('weights_sha256'))[:12]}…); the weights are corrupt or were replaced"
            )
    return meta


def read_trained_on(path: str | Path, meta: dict[str, Any]) -> dict[str, Any]:
    """pars.json's `trained_on` ({} when absent), or CheckpointError when it, its `model` or its
    `members` (what export and blend read) has the wrong type."""
    trained_on = meta.get("trained_on") or {}
    if not isinstance(trained_on, dict):
        raise CheckpointError(f"checkpoint {path}: {META} trained_on {trained_on!r}: expected a mapping")
    model, members = trained_on.get("model"), trained_on.get("members")
    if model is not None and (not isinstance(model, str) or not model):
        raise CheckpointError(f"checkpoint {path}: {META} trained_on.model {model!r}: expected a model name")
    if members is not None and (not isinstance(members, list) or not all(isinstance(m, str) and m for m in members)):
        raise CheckpointError(
            f"checkpoint {path}: {META} trained_on.members {members!r}: expected a list of model names"
        )
    return trained_on


def check_destination(src: Path, dst: Path) -> None:
    """Refuse a `dst` that copy_checkpoint must not delete: anything but a plain-named child
    directory of its parent (`out/..`, `/`, `out/` with an empty name), a file, a link, or the
    source itself or a directory holding it. Raises before anything is deleted."""
    if not plain_name(dst.name):
        raise CheckpointError(f"export destination {dst}: must be a named directory inside its parent")
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise CheckpointError(f"export destination {dst}: exists and is not a directory; not replacing it")
    source, target = src.resolve(), dst.resolve()
    if target == source or target in source.parents:
        raise CheckpointError(f"export destination {dst}: is the source checkpoint {src} or holds it")


def copy_checkpoint(
    src: str | Path, dst: str | Path, *, accept: Callable[[Path], Any] | None = None, **meta_updates: Any
) -> Path:
    """Copy a valid checkpoint to `dst` with `meta_updates` merged into its pars.json.

    The source is validated first (hash included) and the copy re-hashed, so an export can never
    carry weights other than the ones evaluated. `dst` is replaced whole, via a temp dir + rename;
    a `dst` that is not a plain-named directory of its own (check_destination) is refused first.
    `accept(tmp)` finishes and checks the copy before the rename: if it raises, `dst` is untouched."""
    import shutil

    src, dst = Path(src), Path(dst)
    check_destination(src, dst)
    meta = read_meta(src)

    def fill(tmp: Path) -> None:
        shutil.copytree(src, tmp)
        if sha256_file(tmp / WEIGHTS) != meta["weights_sha256"]:
            raise CheckpointError(f"copying {src} to {dst}: the copied weights do not hash as the source's")
        # the identity of the weights is not the caller's to change
        meta.update({k: v for k, v in meta_updates.items() if k not in ("format_version", "weights_sha256")})
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if accept is not None:
            accept(tmp)

    return replace_dir(dst, fill)


def attach_lexical(out_dir: str | Path, lexical, *, encoder_weight: float, lexical_weight: float, **facts: Any) -> dict:
    """Save `lexical` (a TfidfRidge) into the checkpoint at `out_dir` and record in its pars.json
    how serving combines it with the encoder, with the files' hashes; returns that record."""
    from pipeline.ranking.lexical import VOCAB_FILE, WEIGHTS_FILE

    out = Path(out_dir)
    meta = read_meta(out)
    record = {
        **lexical.save(out),
        **facts,
        "encoder_weight": float(encoder_weight),
        "lexical_weight": float(lexical_weight),
        "files_sha256": {name: sha256_file(out / name) for name in (VOCAB_FILE, WEIGHTS_FILE)},
    }
    meta[LEXICAL] = record
    (out / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return record


def attach_decoder(out_dir: str | Path, prior, *, score_weight: float, decoder_weight: float, **facts: Any) -> dict:
    """Save `prior` (a DecoderPrior) into the checkpoint at `out_dir` and record in its pars.json how
    serving adds it to the checkpoint's score, with its files' hashes; returns that record."""
    out = Path(out_dir)
    meta = read_meta(out)
    files = prior.save(out)
    record = {
        **facts,
        "layers": list(prior.features.layers),
        "max_length": int(prior.features.max_length),
        "head": prior.head_kind,
        "score_weight": float(score_weight),
        "decoder_weight": float(decoder_weight),
        "files_sha256": {name: sha256_file(out / name) for name in files},
    }
    meta[DECODER] = record
    (out / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return record
