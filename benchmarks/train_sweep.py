"""Train settings compared on a val split: one `pars train` run per entry of a grid file, each the
`train` params section with that entry's overrides, the val tau_b of its best epoch written as it
finishes. For questions a CPU cannot afford to answer (full fine-tuning, longer prompts, more data),
the same grid runs on a GPU with `--gpu`; val only (the test split is for final figures).

    python benchmarks/train_sweep.py benchmarks/grids/example.yaml --out /tmp/sweep.json
    python benchmarks/train_sweep.py GRID --gpu --data DATA_ROOT --out metrics/choices/X.json

A grid file:

    question: what the sweep asks
    base: {model: chatgpt, method: pairwise, overrides: {epochs: 3}}   # shared by every run
    runs:
      default: {}
      lr 2e-4: {overrides: {lr: 2.0e-4}}
      later turns: {model: chatgpt_turns}                      # data/pairs/chatgpt_turns/
      delta 0.35: {delta: 0.35}    # pairs rebuilt by the pairs stage with this pairs.delta

Override keys must exist in the train section (a typo fails before anything trains). A run (or base)
with `delta` trains on pairs the pairs stage rebuilds in a scratch data root with that pairs.delta (the
rest of the pairs section from --params; prompts and generations read from --data): train forms its
in-batch pairs with the δ of pairs/<model>/meta.json. The output keeps finished runs: a rerun skips a
run already there with the same settings (for a delta run, its δ: not the rest of the pairs section).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import write_json  # noqa: E402
from pipeline.params import load_params, read_yaml  # noqa: E402
from pipeline.profile import deep_merge  # noqa: E402

RUN_KEYS = ("model", "method", "overrides", "delta")  # of base and of each run
GPU_LIGHTNING = {"accelerator": "gpu", "devices": 1, "num_nodes": 1, "precision": "32-true", "strategy": "auto"}


def merged(base: dict[str, Any], overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """`base` with `overrides` deep-merged as `pars profile` does; a key not in base is an error."""
    for key, value in overrides.items():
        if key not in base:
            raise SystemExit(f"train_sweep: {where}: {key!r} is not a train param")
        if isinstance(value, dict) and isinstance(base[key], dict):
            merged(base[key], value, f"{where}.{key}")  # checks the nested keys
    return deep_merge(base, overrides, replace=set())


def plan(grid: dict[str, Any], train: dict[str, Any], gpu: bool, grid_path: str) -> dict[str, dict[str, Any]]:
    """Every run's model, method and full train section, checked before anything trains."""
    if not isinstance(grid, dict) or not isinstance(grid.get("runs"), dict) or not grid["runs"]:
        raise SystemExit(f"train_sweep: {grid_path}: no runs (a mapping `runs:` of name -> settings)")
    base = grid.get("base") or {}
    bad = [str(n) for n, r in grid["runs"].items() if r is not None and not isinstance(r, dict)]
    if not isinstance(base, dict) or bad:
        raise SystemExit(f"train_sweep: {grid_path}: base and each run must be a mapping ({', '.join(bad) or 'base'})")
    for where, entry in [("base", base)] + [(f"runs.{n}", r or {}) for n, r in grid["runs"].items()]:
        unknown = sorted(str(k) for k in entry if k not in RUN_KEYS)
        if unknown:  # a misspelt `delta` would otherwise train at the data root's δ, recorded as asked
            raise SystemExit(
                f"train_sweep: {grid_path}: {where}: unknown key {unknown[0]!r} (keys: {', '.join(RUN_KEYS)})"
            )
    base_cfg = merged(dict(train), {"lightning": GPU_LIGHTNING} if gpu else {}, f"{grid_path}: gpu")
    base_cfg = merged(base_cfg, base.get("overrides") or {}, f"{grid_path}: base.overrides")
    runs = {}
    for name, run in grid["runs"].items():
        run = run or {}
        cfg = merged(base_cfg, run.get("overrides") or {}, f"{grid_path}: runs.{name}.overrides")
        runs[str(name)] = {
            "model": run.get("model", base.get("model", "chatgpt")),
            "method": run.get("method", base.get("method", "pairwise")),
            "train": cfg,
        }
        delta, where = (run["delta"], f"runs.{name}") if "delta" in run else (base.get("delta"), "base")
        if delta is not None:  # only then a key: earlier records' settings still match theirs
            if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
                raise SystemExit(f"train_sweep: {grid_path}: {where}: delta {delta!r} must be a number in (0, 1)")
            runs[str(name)]["delta"] = float(delta)
            members_of(runs[str(name)], f"{grid_path}: runs.{name}")
    return runs


def members_of(run: dict[str, Any], where: str) -> list[str]:
    """The models whose pairs a run trains on: a cross-model set's members (checked by train's own
    rule, one line naming the set), else the model itself."""
    from pipeline.params import Section
    from pipeline.train import check_cross_models

    cfg = Section(run["train"], f"{where}: train")
    check_cross_models(cfg)
    return list(cfg.mapping("cross_models").get(run["model"], [run["model"]]))


def delta_pairs_section(params: str | None, data_root: str) -> dict[str, Any]:
    """The pairs section a delta run rebuilds its pairs with (its own delta aside), checked by the
    pairs stage's rules, and the --data folders it reads: before anything trains."""
    from pipeline.pairs import check_params

    try:
        section = load_params("pairs", params)
    except KeyError as exc:  # no pairs section
        raise SystemExit(f"train_sweep: {exc.args[0]} (a run with delta rebuilds its pairs with it)") from None
    check_params(section)  # a bad value: one line naming the params file and key
    for sub in ("prompts", "generations"):
        if not Path(data_root, sub).is_dir():
            raise SystemExit(
                f"train_sweep: --data {data_root} has no {sub}/ (a run with delta rebuilds its pairs from it)"
            )
    return dict(section)


def pairs_at_delta(data_root: str, scratch: Path, members: list[str], delta: float, pairs: dict[str, Any]) -> str:
    """A data root under `scratch` whose pairs/<member>/ the pairs stage rebuilt with `pairs`
    (delta_pairs_section) at pairs.delta = `delta`, prompts and generations linked from `data_root`."""
    import yaml

    from pipeline.pairs import main as pairs_main

    root = scratch / "data"
    root.mkdir()
    for sub in ("prompts", "generations"):
        (root / sub).symlink_to(Path(data_root, sub).resolve(), target_is_directory=True)
    pairs_params = scratch / "pairs-params.yaml"
    pairs_params.write_text(yaml.safe_dump({"pairs": {**pairs, "delta": delta}}))
    for member in members:
        argv = ["--model", member, "--params", str(pairs_params), "--data", str(root)]
        pairs_main([*argv, "--metrics", str(scratch / "pairs-metrics")])
    return str(root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", help="grid file (YAML): base and runs")
    ap.add_argument("--out", required=True, help="JSON written after every run (finished runs are kept)")
    ap.add_argument(
        "--data",
        default="data",
        help="data root holding prompts/ and pairs/<model>/ (generations/ for a run with delta)",
    )
    ap.add_argument(
        "--params",
        default=None,
        help="params file whose train section is the base, with the pairs section a delta run rebuilds from (params.yaml)",
    )
    ap.add_argument("--gpu", action="store_true", help="train on one CUDA GPU (train.lightning overridden)")
    ap.add_argument("--encoder", default=None, help="a local encoder directory in place of train.encoder")
    ap.add_argument("--plot", default=None, help="also draw every run's val tau_b to this PNG")
    args = ap.parse_args(argv)

    grid_path = Path(args.grid)
    if not grid_path.is_file():
        raise SystemExit(f"train_sweep: grid file {grid_path} not found")
    grid = read_yaml(grid_path) or {}  # a syntax error or a key written twice: one line naming file and line
    train = load_params("train", args.params)
    if args.encoder:
        if not Path(args.encoder).is_dir():
            raise SystemExit(f"train_sweep: --encoder {args.encoder} is not a directory")
        train["encoder"] = args.encoder
    runs = plan(grid, train, args.gpu, str(grid_path))
    pairs = delta_pairs_section(args.params, args.data) if any("delta" in r for r in runs.values()) else None
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("train_sweep: --gpu but torch sees no CUDA device")
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: fp32 weights, several times faster

    from pipeline.train import train_one

    out = Path(args.out)
    doc = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    doc.update({"question": grid.get("question"), "grid": str(grid_path), "split": "val", "data": args.data})
    if args.gpu:
        import torch

        doc["device"] = torch.cuda.get_device_name(0)
    results = doc.setdefault("runs", {})
    for i, (name, run) in enumerate(runs.items(), 1):
        if name in results and results[name].get("settings") == run:
            print(f"[{i}/{len(runs)}] {name}: already done (val tau_b {results[name]['val_tau_b']:.4f})", flush=True)
            continue
        print(f"[{i}/{len(runs)}] {name}: {run['model']}/{run['method']}", flush=True)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                data_root = args.data
                if "delta" in run:
                    members = members_of(run, name)
                    data_root = pairs_at_delta(args.data, Path(tmp), members, run["delta"], pairs)
                res = train_one(
                    run["model"],
                    run["method"],
                    run["train"],
                    data_root=data_root,
                    models_root=Path(tmp) / "models",
                    metrics_dir=Path(tmp) / "metrics",
                    plots_dir=Path(tmp) / "plots",
                )
            except (FileNotFoundError, ValueError, KeyError) as exc:  # bad data root, model or setting
                raise SystemExit(f"train_sweep: run {name!r}: {exc}") from exc
            curve = (Path(tmp) / "plots" / f"{run['model']}-{run['method']}.csv").read_text(encoding="utf-8")
        results[name] = {
            "val_tau_b": round(res["val_tau_b"], 4),
            "val_pair_acc": round(res["val_pair_acc"], 4),
            "best_epoch": res["best_epoch"],
            "epochs_run": res["epochs_run"],
            "n_train_prompts": res["n_train_prompts"],
            "pairs_seen": res["pairs_seen"],  # in-batch pairs kept by the δ filter, over every epoch
            "train_seconds": res["train_seconds"],
            "run_seconds": round(time.perf_counter() - t0, 1),
            "curve_csv": curve,
            "settings": run,
        }
        write_json(doc, out)
        print(f"[{i}/{len(runs)}] {name}: val tau_b {res['val_tau_b']:.4f} (epoch {res['best_epoch']})", flush=True)
    if args.plot:
        plot_runs(doc, args.plot)
    return 0


def plot_runs(doc: dict[str, Any], png: str | Path) -> None:
    """One bar per run: its best val tau_b, labelled with the train prompts it saw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["runs"])
    taus = [doc["runs"][n]["val_tau_b"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(names) + 1.2))
    ax.barh(range(len(names)), taus, color="tab:blue")
    for y, n in enumerate(names):
        r = doc["runs"][n]
        ax.text(r["val_tau_b"] + 0.002, y, f"{r['val_tau_b']:.3f} ({r['n_train_prompts']:,} prompts)", va="center")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(min(taus) - 0.03, max(taus) + 0.05)
    ax.set_xlabel("val Kendall tau_b (best epoch)")
    ax.set_title(f"{Path(doc['grid']).stem}: {doc.get('device') or 'CPU'}", fontsize=10)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from pipeline.cli import run_script

    sys.exit(run_script(main))
