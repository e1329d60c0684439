"""Reading `params.yaml`: each stage reads only its own section.

params.yaml is the one home of every default: a stage indexes its keys (`params["lr"]`) rather
than `params.get("lr", default)`, and a key the file lacks fails in one line that names it
(`params.yaml: train.lr is missing`). `.get` is left for keys whose absence has a meaning.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PARSError, check_number

PARAMS_HELP = "params file (default: $PARS_PARAMS if set, else params.yaml)"  # every stage's --params

# 3e-4, 1e5: PyYAML (YAML 1.1) reads an exponent number as a float only with a dot and a signed exponent
_EXPONENT = re.compile(r"([-+]?[0-9]+)(?:\.([0-9]*))?[eE]([-+]?)([0-9]+)")


def text_number(value: Any) -> str:
    """A note for the error line when `value` is a number the YAML file holds as text (`lr: 3e-4`,
    `lr: '0.5'`), else "". It stays refused: DVC's params and other YAML readers see a string too."""
    if not isinstance(value, str):
        return ""
    exponent = _EXPONENT.fullmatch(value.strip())
    if exponent and (exponent.group(2) is None or not exponent.group(3)):  # else a float YAML reads: quoted
        whole, fraction, sign, power = exponent.groups()
        return f" (YAML reads {value} as text: write {whole}.{fraction or '0'}e{sign or '+'}{power})"
    try:
        number = float(value)
    except ValueError:
        return ""
    return " (a quoted string: write the number without quotes)" if math.isfinite(number) else ""


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

    # Typed reads: a stage checks its numbers where it reads them, before any slow work, so a bad
    # value fails in one line naming the key (`params.yaml: train.batch_size -1: must be at least 1`)
    # instead of a numpy message, or a silently wrong run, minutes later.
    def integer(self, key: str, *, minimum: int | None = None, maximum: int | None = None, optional: bool = False):
        """self[key] as an int (None allowed only if `optional`); a bool, a string or 2.5 is refused."""
        value = self[key]
        name = f"{self.where}.{key}"
        if value is None and optional:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            expected = "an integer or null" if optional else "an integer"
            raise PARSError(f"{name} {value!r}: must be {expected}{text_number(value)}")
        check_number(value, name, minimum=minimum, maximum=maximum)
        return value

    def number(
        self,
        key: str,
        *,
        positive: bool = False,
        minimum: float | None = None,
        below: float | None = None,
        maximum: float | None = None,
        optional: bool = False,
    ):
        """self[key] as a finite float (None allowed only if `optional`), in the given range."""
        value = self[key]
        name = f"{self.where}.{key}"
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            expected = "a number or null" if optional else "a number"
            raise PARSError(f"{name} {value!r}: must be {expected}{text_number(value)}")
        value = float(value)
        check_number(value, name, positive=positive, minimum=minimum, below=below, maximum=maximum)
        return value

    def numbers(self, key: str, **bounds) -> list[float]:
        """self[key] as a non-empty list of finite numbers within `bounds` (number_list)."""
        return number_list(self[key], f"{self.where}.{key}", **bounds)

    def choice(self, key: str, options) -> str:
        """self[key], which must be one of `options`."""
        value = self[key]
        if value not in tuple(options):
            raise PARSError(f"{self.where}.{key} {value!r}: must be one of {', '.join(map(str, options))}")
        return value

    def only(self, known) -> "Section":
        """self, refusing a key outside `known`: a mistyped key (`lrr`, set by a profile or
        `dvc exp run -S`) would otherwise be ignored while the default it meant to change runs."""
        known = list(known)
        for key in self:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise PARSError(f"{self.where}.{key}: not a setting here ({hint}known: {', '.join(known)})")
        return self

    def mapping(self, key: str) -> "Section":
        """self[key], which must be a mapping (an empty one when the file leaves it blank)."""
        value = self[key]
        if value is None:
            return Section({}, f"{self.where}.{key}")
        if not isinstance(value, dict):
            raise PARSError(f"{self.where}.{key}: must be a mapping of keys to values, not {value!r}")
        return value if isinstance(value, Section) else Section(value, f"{self.where}.{key}")


def number_list(
    values: Any, name: str, *, positive: bool = False, minimum: float | None = None, maximum: float | None = None
) -> list[float]:
    """`values` as floats: a non-empty list of finite numbers within the bounds; else one ValueError
    line naming `name` or the bad item (`name[i]`). For params lists read outside a Section too."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{name} {values!r}: must be a non-empty list of numbers")
    limits = ["> 0"] if positive else []
    limits += [f">= {minimum:g}"] if minimum is not None else []
    limits += [f"<= {maximum:g}"] if maximum is not None else []
    for i, v in enumerate(values):
        number = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if not (
            number
            and (not positive or v > 0)
            and (minimum is None or v >= minimum)
            and (maximum is None or v <= maximum)
        ):
            must = f"must be a finite number {' and '.join(limits)}".rstrip()
            raise ValueError(f"{name}[{i}] {v!r}: {must}{text_number(v)}")
    return [float(v) for v in values]


def as_section(value: Any, where: str) -> Any:
    """`value` with every mapping in it a Section named `where` (`<file>: <section>`) plus its dotted key:
    a params section as load_params gives it, for params merged in memory (`pars profile`)."""
    if isinstance(value, dict):
        return Section({k: as_section(v, f"{where}.{k}") for k, v in value.items()}, where)
    return value


def params_path(path: str | Path | None = None) -> Path:
    """The params file: `path`, else $PARS_PARAMS, else params.yaml. Under `dvc repro` / `dvc exp run`
    (DVC sets DVC_STAGE) $PARS_PARAMS must be params.yaml itself: DVC tracks that file, applies `-S` to it
    and records it in dvc.lock, so a stage reading another file would run silently on other settings."""
    if path:
        return Path(path)
    env = os.environ.get("PARS_PARAMS")
    if not env:
        return Path("params.yaml")
    stage = os.environ.get("DVC_STAGE")
    if stage and Path(env).resolve() != Path("params.yaml").resolve():
        raise PARSError(
            f"PARS_PARAMS={env} is set while DVC runs stage {stage}: DVC tracks params.yaml (dvc.lock, -S), "
            f"not {env}; unset PARS_PARAMS, or merge the file into params.yaml: `pars profile {env} --params params.yaml`"
        )
    return Path(env)


def existing_params_path(path: str | Path | None = None) -> Path:
    """params_path(path), or FileNotFoundError naming the file, and $PARS_PARAMS when it came from
    there (a stale variable). Every command that reads the params file finds it here."""
    found = params_path(path)
    if not found.exists():
        origin = " ($PARS_PARAMS)" if not path and os.environ.get("PARS_PARAMS") else ""
        raise FileNotFoundError(f"params file not found: {found}{origin}")
    return found


def load_params(section: str, path: str | Path | None = None) -> Section:
    """Return the `section` of the params file (params_path: default `params.yaml`, or $PARS_PARAMS)."""
    path = existing_params_path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise PARSError(
            f"{path}: must be a mapping of stage sections (prepare:, train:, ...), not {type(data).__name__}"
        )
    if section not in data:
        raise KeyError(f"params file {path} has no section {section!r}")
    value = data[section]
    if value is not None and not isinstance(value, dict):
        raise PARSError(f"{path}: {section} must be a mapping of keys to values, not {value!r}")
    return as_section(value or {}, f"{path}: {section}")


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader refusing a key written twice in one mapping: PyYAML would keep the last one
    silently, while ruamel, which DVC reads params with, refuses the file."""

    def flatten_mapping(self, node):
        # each mapping checked once, as written: before `<<: *base` merges its keys in (they may be
        # overridden), which an outer mapping merging this one may do before this one is built
        checked = self.__dict__.setdefault("_checked_mappings", set())
        if id(node) not in checked:
            checked.add(id(node))
            first: dict[Any, int] = {}  # key -> the line it is first on
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in first
                except TypeError:  # an unhashable key: construct_mapping says so
                    continue
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} written twice, first on line {first[key]}", key_node.start_mark
                    )
                first[key] = key_node.start_mark.line + 1
        super().flatten_mapping(node)


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content (None when empty); a syntax error or a repeated key is one line naming
    the file and line. Every params and profile file is read here."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as fh:
            return yaml.load(fh, Loader=UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise PARSError(f"{where}: not valid YAML ({exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise PARSError(f"{path}: not valid YAML ({exc})") from None
    except UnicodeDecodeError:
        raise PARSError(f"{path}: not a UTF-8 text file") from None
