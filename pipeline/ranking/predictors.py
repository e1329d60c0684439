"""Which predictors params `evaluate` names: the evaluate stage scores them, `pars profile` lists their
checkpoints as that stage's DVC deps (DVC cannot build a dep list from params), so both read this."""

from __future__ import annotations

from typing import Any

from pipeline.errors import PARSError


def names(evaluate: dict[str, Any], key: str) -> list[str]:
    """evaluate[key], a list of names (empty when absent or null); anything else is one line naming the
    key, not a TypeError from iterating it (`train_models: 5`, set by a profile)."""
    value = evaluate.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise PARSError(f"{getattr(evaluate, 'where', 'params evaluate')}.{key} {value!r}: must be a list of names")
    return value


def evaluated_predictors(evaluate: dict[str, Any]) -> list[tuple[str, str]]:
    """(train model, method) of every predictor the evaluate section names: per-model ones, then
    cross-model ones (pairwise only), then blended ones ("<train model>/<method>", the blend stage's)."""
    predictors = [(m, meth) for m in names(evaluate, "train_models") for meth in names(evaluate, "methods")]
    predictors += [(m, "pairwise") for m in names(evaluate, "cross_models")]
    for entry in names(evaluate, "blends"):
        model, sep, method = str(entry).partition("/")
        if not (sep and model and method) or "/" in method:
            raise PARSError(f"params evaluate.blends: {entry!r} is not '<train model>/<method>'")
        predictors.append((model, method))
    return predictors
