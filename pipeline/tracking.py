"""Weights & Biases run settings shared by the stages that log (train, evaluate): the mode, the group
that ties one `dvc exp run` / `dvc repro` together, where offline runs are written, and the code
state a run came from. Logging only: nothing here changes a stage's outputs (so it is not a DVC dep)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MODES = ("online", "offline", "disabled", "shared")  # wandb.init's modes
MODE_ALIASES = {"dryrun": "offline", "run": "online"}  # wandb's older spellings


def wandb_mode(configured: str | None = None) -> str:
    """WANDB_MODE in the environment wins; then the stage's configured mode (evaluate.wandb.mode); else
    an API key (WANDB_API_KEY, or `wandb login`'s) means online, and otherwise offline (`wandb sync` later)."""
    for mode in (os.environ.get("WANDB_MODE", ""), configured or ""):
        mode = MODE_ALIASES.get(mode.strip().lower(), mode.strip().lower())
        if mode in MODES:
            return mode
    return "online" if os.environ.get("WANDB_API_KEY") or _stored_login() else "offline"


def _stored_login() -> bool:
    """`wandb login` keeps the key in ~/.netrc ($NETRC) under the W&B server's host."""
    try:
        import netrc
        from urllib.parse import urlparse

        import wandb

        host = urlparse(os.environ.get("WANDB_BASE_URL") or wandb.Settings().base_url).netloc  # with a port, as stored
        return bool(host and netrc.netrc(os.environ.get("NETRC")).authenticators(host))
    except Exception:  # no .netrc, an unreadable one, no wandb: no stored login
        return False


_online_failed = False  # after one online run could not start, the process's later runs go straight offline


def start_run(mode: str, **init: Any):
    """wandb.init in `mode`; when an online run cannot start (no API key, the server unreachable within
    wandb's init_timeout, WANDB_INIT_TIMEOUT), one line says why and the run is logged offline instead: a
    stage's work is never lost to its logging, and `wandb sync` uploads the run later."""
    import wandb

    global _online_failed
    where = Path(init.get("dir") or ".") / "wandb"
    online = mode in ("online", "shared")  # shared: online, several writers to one run
    if online and not _online_failed and not (os.environ.get("WANDB_API_KEY") or _stored_login()):
        # no key: wandb.init would ask for one on a terminal, waiting with no timeout after the stage's work
        _online_failed = True
        print(f"W&B: no API key (WANDB_API_KEY or `wandb login`); logging offline in {where}", file=sys.stderr)
    if online and not _online_failed:
        try:
            return wandb.init(mode=mode, **init)
        except (wandb.errors.Error, TimeoutError) as exc:
            _online_failed = True
            reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            print(f"W&B: cannot log online ({reason.strip()}); logging offline in {where} (`wandb sync` uploads it)",
                  file=sys.stderr)  # fmt: skip
    return wandb.init(mode="offline" if online else mode, **init)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def run_group() -> str:
    """`dvc exp run` names the experiment in DVC_EXP_NAME; a plain `dvc repro` or a manual run is
    grouped by the commit it ran on."""
    name = os.environ.get("DVC_EXP_NAME")
    if name:
        return name
    sha = _git("rev-parse", "--short", "HEAD")
    return f"repro-{sha}" if sha else "local"


def run_dir(configured: str | os.PathLike) -> Path:
    """Where offline runs go. A relative dir is taken from the repository DVC runs the stage for
    ($DVC_ROOT): `dvc exp run --temp` and `--queue` run in a copy under .dvc/tmp that DVC deletes after."""
    path = Path(configured)
    if not path.is_absolute() and os.environ.get("DVC_ROOT"):
        path = Path(os.environ["DVC_ROOT"]) / path
    path.mkdir(parents=True, exist_ok=True)
    return path


def provenance() -> dict[str, Any]:
    """The code state a run came from, for its W&B config: the commit, whether the code had uncommitted
    changes (the code only: a `dvc repro` rewrites dvc.lock, metrics and plots, and `-S` params.yaml), the
    DVC experiment."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", "pipeline", "pyproject.toml")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "code_dirty": None if status is None else bool(status),
        "dvc_exp_name": os.environ.get("DVC_EXP_NAME"),
        "dvc_exp_baseline_rev": os.environ.get("DVC_EXP_BASELINE_REV"),
    }
