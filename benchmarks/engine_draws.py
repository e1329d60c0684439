"""How much does the engine benchmark's FCFS/PARS speedup depend on which prompts the burst holds?

`benchmarks/engine_bench.py` serves one seeded draw of 200 prompts on the real engine (minutes per
policy on a CPU), so its figure is one sample. This replays many draws of the same kind through the
simulator set up as that engine: the step time c0 + c1 * tokens, KV blocks, token budget, prefill
chunk and max_num_seqs fitted and checked by `pars sim-fidelity` (metrics/sim_fidelity.json: the
simulator predicts the engine's speedup within about 10%), the checkpoint's scores arriving at the
background scorer's measured rate, the answer lengths scaled and capped as the benchmark does.
Each draw is a seeded shuffle of the split's prompts, the first N that fit (engine_bench's own
`draw_workload`). Val split by default: the test split is for the benchmark's final figure.

    python benchmarks/engine_draws.py                       # 30 draws of 200, 300 and 400 val prompts

Writes metrics/choices/engine_draws.json (per burst size: FCFS/PARS and PARS/oracle for every draw,
their geometric mean, median, range, and the share of draws at >= 2x) and plots/engine_draws.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import draw_workload, read_split  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="models/export/pars-recorded")
    p.add_argument("--tokenizer", default="models/base/smollm2", help="the served model's tokenizer (prompt tokens)")
    p.add_argument("--fidelity", default="metrics/sim_fidelity.json", help="fitted engine (pars sim-fidelity)")
    p.add_argument("--prompts", default="data/prompts/prompts.parquet")
    p.add_argument("--generations", default="data/generations/chatgpt/generations.parquet")
    p.add_argument("--split", default="val")
    p.add_argument("--sizes", default="200,300,400", help="burst sizes (comma-separated)")
    p.add_argument("--draws", type=int, default=30)
    p.add_argument("--length-scale", type=float, default=0.25)
    p.add_argument("--max-tokens-cap", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--starvation-s", type=float, default=120.0)
    p.add_argument("--out-json", default="metrics/choices/engine_draws.json")
    p.add_argument("--plot", default="plots/engine_draws.png")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1 or args.draws < 1:
        p.error("--sizes and --draws must be positive")
    return args


def summary(values: list[float]) -> dict:
    v = np.asarray(values, dtype=float)
    return {
        "geometric_mean": float(np.exp(np.log(v).mean())),
        "median": float(np.median(v)),
        "min": float(v.min()),
        "max": float(v.max()),
        "share_at_least_2x": float((v >= 2.0).mean()),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    for path in (args.fidelity, Path(args.checkpoint) / "pars.json"):
        if not Path(path).is_file():
            sys.exit(f"engine_draws: {path} not found (run `dvc repro` first, or pass its path)")
    from transformers import AutoTokenizer

    from pipeline.queueing.simulator import burst, simulate
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer
    from pipeline.sim_fidelity import engine_config, score_ready_times

    fidelity = json.loads(Path(args.fidelity).read_text())
    rate = float(fidelity["scoring_rate_prompts_per_s"])
    fcfs_cfg, pars_cfg = (
        engine_config(fidelity["engine"], fidelity["step_model"], args.starvation_s, policy)
        for policy in ("fcfs", "pars")
    )
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    frame = read_split(args.prompts, args.generations, args.split)  # read once; each draw shuffles it
    token_ids: dict[str, list[int]] = {}  # prompt_id -> chat-templated ids, each prompt tokenized once
    scorer = Scorer.from_pretrained(args.checkpoint)
    scores: dict[str, float] = {}  # prompt_id -> checkpoint score, each prompt scored once
    # where an unscored request waits before the first score arrives: the checkpoint's typical score
    # (pars.json `typical_score`, its median val score), as the PARS scheduler and sim-fidelity's
    # replay place it; 0 for a checkpoint exported without one, as the scheduler then does
    typical = scorer.typical_score
    first_provisional = float(typical) if typical is not None else 0.0
    out = {
        "what": "FCFS/PARS mean per-token latency of the engine benchmark's burst, over draws of prompts, "
        "replayed through the simulator fitted to the engine (metrics/sim_fidelity.json)",
        "command": " ".join(["python benchmarks/engine_draws.py", *(argv if argv is not None else sys.argv[1:])]),
        "split": args.split,
        "checkpoint": args.checkpoint,
        "engine": fidelity["engine"],
        "step_model": {k: fidelity["step_model"][k] for k in ("c0_s", "c1_s_per_token")},
        "scoring_rate_prompts_per_s": rate,
        "first_provisional_score": first_provisional,
        "first_provisional_from": "checkpoint typical_score" if typical is not None else "0 (no typical_score)",
        "sizes": {},
    }
    for n in args.sizes:
        rows = []
        for seed in range(args.draws):
            draw = types.SimpleNamespace(
                seed=seed,
                length_scale=args.length_scale,
                max_tokens_cap=args.max_tokens_cap,
                max_model_len=args.max_model_len,
                num_prompts=n,
            )
            workload = draw_workload(frame, draw, tokenizer, token_ids)
            new = [r for r in workload if r["prompt_id"] not in scores]
            if new:
                scores.update(zip([r["prompt_id"] for r in new], map(float, scorer.score([r["prompt"] for r in new]))))
            s = np.array([len(r["ids"]) for r in workload])
            o = np.array([r["length"] for r in workload])
            key = np.array([scores[r["prompt_id"]] for r in workload])
            arrival = burst(len(s))
            mean = {
                "fcfs": simulate(arrival, s, o, key=arrival, config=fcfs_cfg),
                "pars": simulate(
                    arrival,
                    s,
                    o,
                    key=key,
                    config=pars_cfg,
                    key_ready=score_ready_times(s, rate),
                    first_provisional=first_provisional,
                    sort_running=True,
                ),
                "oracle": simulate(arrival, s, o, key=o.astype(float), config=pars_cfg, sort_running=True),
            }
            mean = {k: v.summary()["mean_per_token_latency"] for k, v in mean.items()}
            rows.append(
                {
                    "seed": seed,
                    "requests": len(workload),
                    "tau_b": kendall_tau_b(key, o),
                    "fcfs_over_pars": mean["fcfs"] / mean["pars"],
                    "pars_over_oracle": mean["pars"] / mean["oracle"],
                }
            )
        out["sizes"][str(n)] = {
            "fcfs_over_pars": summary([r["fcfs_over_pars"] for r in rows]),
            "pars_over_oracle": summary([r["pars_over_oracle"] for r in rows]),
            "median_tau_b": float(np.median([r["tau_b"] for r in rows])),
            "draws": rows,
        }
        f = out["sizes"][str(n)]["fcfs_over_pars"]
        print(
            f"engine_draws: {n} requests x {args.draws} draws: FCFS/PARS geometric mean {f['geometric_mean']:.2f}, "
            f"median {f['median']:.2f}, range {f['min']:.2f}-{f['max']:.2f}, {f['share_at_least_2x']:.0%} of draws >= 2x",
            flush=True,
        )
    path = Path(args.out_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, Path(args.plot))
    print(f"wrote {path} and {args.plot}")
    return 0


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(out["sizes"])
    fig, ax = plt.subplots(figsize=(6, 4))
    rng = np.random.default_rng(0)
    for i, n in enumerate(sizes):
        v = [r["fcfs_over_pars"] for r in out["sizes"][n]["draws"]]
        ax.scatter(i + rng.uniform(-0.12, 0.12, len(v)), v, s=14, alpha=0.6)
        ax.hlines(out["sizes"][n]["fcfs_over_pars"]["geometric_mean"], i - 0.25, i + 0.25, color="k")
    ax.axhline(2.0, ls="--", color="grey", lw=1, label="2x")
    ax.set_xticks(range(len(sizes)), [f"{n} requests" for n in sizes])
    ax.set_ylabel("FCFS / PARS mean per-token latency")
    ax.set_title(f"Engine burst over draws of {out['split']} prompts (simulated, fitted engine)", fontsize=9)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
