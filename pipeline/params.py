"""Reading `params.yaml`: each stage reads only its own section."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def load_params(section: str, path: str | Path | None = None) -> dict[str, Any]:
    """Return the `section` of the params file (default `params.yaml`, or $PARS_PARAMS)."""
    path = Path(path or os.environ.get("PARS_PARAMS", "params.yaml"))
    if not path.exists():
        raise FileNotFoundError(f"params file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if section not in data:
        raise KeyError(f"params file {path} has no section {section!r}")
    return data[section] or {}
