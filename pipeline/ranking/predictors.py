"""Which predictors params `evaluate` names: the evaluate stage scores them, `pars profile` lists their
checkpoints as that stage's DVC deps (DVC cannot build a dep list from params), so both read this."""

from __future__ import annotations

from typing import Any

from pipeline.errors import PARSError


def evaluated_predictors(evaluate: dict[str, Any]) -> list[tuple[str, str]]:
    """(train model, method) of every predictor the evaluate section names: per-model ones, then
    cross-model ones (pairwise only), then blended ones ("<train model>/<method>", the blend stage's)."""
    predictors = [(m, meth) for m in evaluate.get("train_models") or [] for meth in evaluate.get("methods") or []]
    predictors += [(m, "pairwise") for m in evaluate.get("cross_models") or []]
    for entry in evaluate.get("blends") or []:
        model, sep, method = str(entry).partition("/")
        if not (sep and model and method) or "/" in method:
            raise PARSError(f"params evaluate.blends: {entry!r} is not '<train model>/<method>'")
        predictors.append((model, method))
    return predictors
