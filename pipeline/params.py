"""Reading `params.yaml`: each stage reads only its own section.

params.yaml is the one home of every default: a stage indexes its keys (`params["lr"]`) rather
than `params.get("lr", default)`, and a key the file lacks fails in one line that names it
(`params.yaml: train.lr is missing`). `.get` is left for keys whose absence has a meaning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


class MissingParam(KeyError):
    """A key the params file must have; str() is the plain line (KeyError's would be quoted)."""

    def __str__(self) -> str:
        return str(self.args[0])


class Section(dict):
    """A mapping of the params file whose missing key raises MissingParam naming `<file>: <dotted key>`."""

    where = "params"  # set per instance; the class value serves copies made without __init__

    def __init__(self, data: Any = (), where: str = "params"):
        super().__init__(data)
        self.where = where

    def __missing__(self, key: Any) -> Any:
        raise MissingParam(f"{self.where}.{key} is missing")


def _section(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return Section({k: _section(v, f"{where}.{k}") for k, v in value.items()}, where)
    return value


def load_params(section: str, path: str | Path | None = None) -> Section:
    """Return the `section` of the params file (default `params.yaml`, or $PARS_PARAMS)."""
    path = Path(path or os.environ.get("PARS_PARAMS", "params.yaml"))
    if not path.exists():
        raise FileNotFoundError(f"params file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if section not in data:
        raise KeyError(f"params file {path} has no section {section!r}")
    return _section(data[section] or {}, f"{path}: {section}")
