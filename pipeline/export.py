"""export: the chosen predictor (params `export`) -> models/export/<name>/, a self-describing checkpoint.

The trained checkpoint (already in the serving format, written by train through save_checkpoint)
is copied byte for byte, its hash checked on both sides, and pars.json completed with the export
name and the predictor's test tau_b on its own model's answers (a cross-model predictor: on each
model it was trained on, the lowest as test_tau_b), read from metrics/ranking.json.
pars.json also lists the sha256 of every file of the export (`files_sha256`), which the loader checks,
and the checkpoint's median score on the val prompts (`typical_score`): the scheduler places a request
it has not scored yet there until it has seen scores of its own (the scores' offset is the checkpoint's,
e.g. about log answer length for one with a lexical prior, so 0 is no middle).
The result loads with `pipeline.serving.Scorer.from_pretrained` alone (torch + transformers; no
Lightning), which the stage checks before it finishes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from pipeline.contracts import nested_value
from pipeline.errors import PARSError, plain_name
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.ranking.checkpoint import (
    FILES_SHA256,
    META,
    TYPICAL_SCORE,
    CheckpointError,
    copy_checkpoint,
    file_hashes,
    read_meta,
    read_trained_on,
)


def export_dir(name: str, root: str | Path = "models/export") -> Path:
    return Path(root) / name


def record_file_hashes(dst: Path) -> dict[str, str]:
    """List the sha256 of every file of the checkpoint (config, tokenizer files, weights, the lexical
    and decoder files) in its pars.json, so the serving loader refuses any of them changed after export."""
    from pipeline.contracts import write_json

    meta = json.loads((dst / META).read_text(encoding="utf-8"))
    meta[FILES_SHA256] = file_hashes(dst)
    write_json(meta, dst / META)
    return meta[FILES_SHA256]


def in_domain_metrics(
    ranking: dict, model: str, method: str, path: str | Path = "metrics/ranking.json", eval_model: str | None = None
) -> dict:
    """The predictor's test results on `eval_model`'s answers (default: its own model's), overall
    and per dataset."""
    eval_model = eval_model or model
    by_group = nested_value(ranking, "predictors", model, method, eval_model)
    if not isinstance(by_group, dict) or not isinstance(by_group.get("overall"), dict):
        raise ValueError(
            f"{path} has no test tau_b for {model}/{method} on {eval_model}'s answers "
            f"(evaluate needs {model} among its predictors and {eval_model} in evaluate.eval_models)"
        )
    overall = by_group["overall"]
    key = f"predictors.{model}.{method}.{eval_model}.overall.kendall_tau_b"
    if "kendall_tau_b" not in overall:  # a damaged file: exported as null, or left out of a cross-model minimum
        raise ValueError(f"{path} has no {key} (rerun evaluate)")
    tau = overall["kendall_tau_b"]
    if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float))):
        raise ValueError(f"{path}: {key} {tau!r} is not a number")
    if tau is not None and not (tau != tau or -1 <= tau <= 1):  # NaN (!= itself): undefined, as evaluate writes it
        raise ValueError(f"{path}: {key} {tau!r} is not a tau_b (between -1 and 1)")
    refs = nested_value(ranking, "references", eval_model, "overall")
    refs = refs if isinstance(refs, dict) else {}
    return {
        "eval_model": eval_model,
        "split": "test",
        **{k: overall.get(k) for k in ("kendall_tau_b", "ci_low", "ci_high", "n_prompts", "pair_accuracy")},
        "per_dataset_tau_b": {g: nested_value(s, "kendall_tau_b") for g, s in by_group.items() if g != "overall"},
        "prompt_length_tau_b": nested_value(refs, "prompt_length", "kendall_tau_b"),
        "noise_ceiling_tau_b": nested_value(refs, "noise_ceiling", "kendall_tau_b"),
        "tfidf_ridge_tau_b": nested_value(refs, "tfidf_ridge", "kendall_tau_b"),
    }


def export_metrics(ranking: dict, model: str, method: str, members: list[str], path: str | Path) -> tuple[dict, float]:
    """(test_metrics, test_tau_b) for pars.json. A per-model predictor: its own model's answers. A
    cross-model predictor (trained on `members`): each member's answers, and test_tau_b is the
    lowest of them (what serving any of those models can count on)."""
    if len(members) <= 1:
        metrics = in_domain_metrics(ranking, model, method, path)
        return metrics, metrics["kendall_tau_b"]
    by_model = {m: in_domain_metrics(ranking, model, method, path, eval_model=m) for m in members}
    for m, v in by_model.items():  # a member left out would raise the minimum (and NaN makes min() order-dependent)
        if v["kendall_tau_b"] is None or v["kendall_tau_b"] != v["kendall_tau_b"]:
            raise ValueError(
                f"{path}: predictors.{model}.{method}.{m}.overall.kendall_tau_b is {v['kendall_tau_b']!r}: "
                f"test_tau_b is the lowest over the members {members}, so each needs a finite one (rerun evaluate)"
            )
    taus = [v["kendall_tau_b"] for v in by_model.values()]
    return {"by_eval_model": by_model, "summary": "test_tau_b = the lowest over by_eval_model"}, min(taus)


def typical_score(scorer, prompts_path: str | Path) -> dict:
    """The checkpoint's median score over the distinct val prompts of the prompts table."""
    import numpy as np

    from pipeline.contracts import PROMPTS, read_table

    prompts = read_table(prompts_path, PROMPTS)
    texts = prompts.loc[prompts["split"] == "val", "prompt"].drop_duplicates().tolist()
    if not texts:
        raise ValueError(f"{prompts_path} has no val prompts to take the checkpoint's typical score from")
    scores = np.asarray(scorer.score(texts), dtype=np.float64)
    if not np.isfinite(scores).all():
        raise ValueError(f"the exported checkpoint gives non-finite scores on {prompts_path}'s val prompts")
    return {"median": float(np.median(scores)), "split": "val", "n_prompts": len(texts)}


def check_params(params: dict) -> None:
    """The export section: name becomes a directory that is replaced whole, so it must be a plain
    name (`..` or an empty name would replace --out's parent, or --out itself)."""
    where = getattr(params, "where", "export")
    Section(params, where).only(("name", "model", "method"))
    for key in ("name", "model", "method"):
        value = params[key]
        if not isinstance(value, str) or not value.strip():
            raise PARSError(f"{where}.{key} {value!r}: must be a non-empty string")
    if not plain_name(params["name"]):
        raise PARSError(f"{where}.name {params['name']!r}: must be a plain directory name (no '/', not '.' or '..')")


def run(
    params: dict,
    *,
    models_root: str | Path = "models",
    ranking_path: str | Path = "metrics/ranking.json",
    out_root: str | Path = "models/export",
    prompts_file: str | Path | None = None,
) -> Path:
    """Export; with `prompts_file`, pars.json also gets the checkpoint's `typical_score`."""
    from pipeline.contracts import ensure_parent, predictor_dir, read_json
    from pipeline.serving.scorer import Scorer

    check_params(params)
    name, model, method = params["name"], params["model"], params["method"]
    src = predictor_dir(model, method, models_root)
    ensure_parent(export_dir(name, out_root) / META, create=False)  # --out under a file: one line, before any work
    ranking_path = Path(ranking_path)
    if not ranking_path.is_file():
        raise FileNotFoundError(f"{ranking_path} does not exist (run evaluate first: it gives the test tau_b)")
    ranking = read_json(ranking_path)
    if prompts_file is not None and not Path(prompts_file).is_file():
        raise FileNotFoundError(
            f"{prompts_file} does not exist (run prepare first: its val prompts give the typical score)"
        )
    if not src.is_dir():  # a typo in a params key: name the key, not only the path it made
        key = "model" if not src.parent.is_dir() else "method"
        raise CheckpointError(
            f"{getattr(params, 'where', 'export')}.{key} {params[key]!r}: checkpoint directory {src} does not exist "
            f"(train it first, or name a predictor under {Path(models_root)})"
        )
    source_meta = read_meta(src)  # validates the source (files, version, hash) with a clear message
    trained_on = {"model": model, **read_trained_on(src, source_meta)}
    members = list(trained_on.get("members") or [model])
    metrics, tau = export_metrics(ranking, model, method, members, ranking_path)
    # scored on the source (the same bytes as the export): a failure here replaces nothing
    typical = {} if prompts_file is None else {TYPICAL_SCORE: typical_score(Scorer.from_pretrained(src), prompts_file)}

    def accept(copy: Path) -> None:
        """The acceptance test of an export, on the finished copy before it replaces the old one:
        every file hashed into pars.json, and the serving loader takes it and gives finite scores."""
        record_file_hashes(copy)
        probe = Scorer.from_pretrained(copy).score(["How are you?", "Write a detailed essay on the history of Rome."])
        if not all(map(math.isfinite, probe)):
            raise ValueError(
                f"the export of {src} gives non-finite scores: {export_dir(name, out_root)} left as it was"
            )

    return copy_checkpoint(
        src,
        export_dir(name, out_root),
        accept=accept,
        name=name,
        trained_on=trained_on,
        test_tau_b=None if tau is None or math.isnan(tau) else float(tau),
        test_metrics=metrics,
        exported_from=str(src),
        **typical,
    )


def main(argv: list[str] | None = None) -> int:
    from pipeline.contracts import prompts_path

    parser = argparse.ArgumentParser(prog="pars export", description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help=PARAMS_HELP)
    parser.add_argument("--models", default="models", help="models root (<root>/<model>/<method>/)")
    parser.add_argument("--ranking", default="metrics/ranking.json", help="evaluate's metrics (test tau_b)")
    parser.add_argument("--out", default="models/export", help="writes <out>/<name>/")
    parser.add_argument("--prompts", default=str(prompts_path()), help="prepare's prompts (val: the typical score)")
    args = parser.parse_args(argv)
    dst = run(
        load_params("export", args.params),
        models_root=args.models,
        ranking_path=args.ranking,
        out_root=args.out,
        prompts_file=args.prompts,
    )
    meta = read_meta(dst)
    print(
        f"export: {dst} ({meta['method']}, trained on {meta['trained_on'].get('model')}, "
        f"test tau_b {meta['test_tau_b']}, sha256 {meta['weights_sha256'][:12]}…)"
    )
    return 0
