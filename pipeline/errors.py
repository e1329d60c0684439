"""The one error type for bad input: the `pars` CLI prints it in one line, without a traceback.

Raise `PARSError` (or a subclass) where an input enters: a CLI flag, a params section, a file the
user gave. The message names the flag, file, line or params key, and says what is wrong.
"""

from __future__ import annotations

import math
from typing import Any


class PARSError(Exception):
    """Bad input: the CLI prints it in one line (`pars <cmd>: error: <message>`)."""


class UsageError(PARSError):
    """A command line argparse refused (unknown flag, a value of the wrong type)."""


def check_number(
    value: float | int | None,
    flag: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
    below: float | None = None,
    maximum: float | None = None,
) -> None:
    """Refuse a number that would give a silently wrong answer: NaN, infinite or out of range."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise PARSError(f"{flag} {value}: must be a finite number")
    if positive and not value > 0:
        raise PARSError(f"{flag} {value}: must be positive")
    if minimum is not None and value < minimum:
        raise PARSError(f"{flag} {value}: must be at least {minimum:g}")
    if below is not None and not value < below:
        raise PARSError(f"{flag} {value}: must be below {below:g}")
    if maximum is not None and value > maximum:
        raise PARSError(f"{flag} {value}: must be at most {maximum:g}")


def plain_name(name: Any) -> bool:
    """A directory name that stays in its parent: a non-empty string, no path separator, not . or .."""
    return (
        isinstance(name, str)
        and name.strip() not in ("", ".", "..")
        and not any(sep in name for sep in ("/", "\\", "\0"))
    )
