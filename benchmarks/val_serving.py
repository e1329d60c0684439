"""What a predictor buys in serving, measured on a model's val split: choose a training setting by
the serving objective without touching the test split (where `pars simulate` reports final figures).

Every val prompt of the eval model (one of its answers at random) arrives in one burst at the
simulator, configured as `simulate.engine` in params.yaml; FCFS, oracle SJF and each predictor's
shortest-predicted-first order are simulated. Printed and written: mean / p90 per-token latency,
speedup over FCFS, gap to oracle, tau_b of each order on these requests, and where each order loses
to oracle (its excess mean per-token latency by true answer length). With --noise-twins each
predictor also gets a twin of the same tau_b made of true lengths plus noise: where the two differ, the
predictor's errors fall on requests that matter more (or less) to latency than random ones would.
Each predictor's costliest requests (largest excess over oracle: answer length, where its order put
them, the answer's first words) show which few requests a mean per-token latency hangs on. With
--probe-tokens K each predictor is also served after a probe phase (as multi-level feedback queues do):
every request first generates up to K tokens, so answers that short finish at once whatever their
score, and the rest are preempted (recompute) back into score order.

    python benchmarks/val_serving.py                                   # ChatGPT val, the export and per-model predictors
    python benchmarks/val_serving.py --predictors recorded/pairwise,/tmp/exp/x/models/chatgpt/pairwise
    python benchmarks/val_serving.py --predictors recorded/pairwise --noise-twins --out /tmp/twins.json
    python benchmarks/val_serving.py --predictors chatgpt/pairwise --probe-tokens 4,8,16,32
    python benchmarks/val_serving.py --predictors chatgpt/pairwise+decoder --blend-weights 0,0.1,0.2,0.3,0.5,1

With --blend-weights W each decoder blend is also served as W * z(its score without the decoder
prior: the fine-tuned predictor's, lexical prior included) + (1 - W) * z(its decoder head's),
z-scored on these prompts: the blend weight by the serving objective, where the blend stage chose it
by val tau_b.

A predictor is <train model>/<method> under models/, or a path to a checkpoint directory.
Writes --out (default metrics/choices/val_serving-<model>.json).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoder_features import zscore  # noqa: E402

from pipeline.cli import comma_numbers  # noqa: E402
from pipeline.contracts import generations_path, prompts_path, write_json  # noqa: E402
from pipeline.params import load_params  # noqa: E402
from pipeline.queueing.policies import on_pars_scheduler  # noqa: E402
from pipeline.ranking.decoder import SUBDIR as DECODER_SUBDIR  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402

# answer-length buckets (tokens) of the excess-over-oracle breakdown: (lo, hi] each
LENGTH_EDGES = (0, 5, 20, 100, 400, np.inf)
LENGTH_LABELS = ("1-5", "6-20", "21-100", "101-400", ">400")


def checkpoint_dir(name: str) -> Path:
    path = Path(name)
    return path if path.is_dir() and (path / "pars.json").is_file() else Path("models") / name


def noise_twin(lengths: np.ndarray, tau: float, seed: int) -> np.ndarray:
    """Scores log(1 + length) + sigma * N(0, 1) (one fixed draw) with sigma found by bisection so that
    their tau_b against `lengths` matches `tau` (to 0.001): the same ranking quality as a predictor,
    its errors spread like noise instead of where the predictor makes them (tau <= 0: about pure noise)."""
    base = np.log1p(lengths.astype(np.float64))
    eps = np.random.default_rng(seed).normal(size=lengths.size)
    lo, hi = 0.0, 50.0  # tau falls as sigma grows
    for _ in range(40):
        sigma = (lo + hi) / 2
        scores = base + sigma * eps
        gap = kendall_tau_b(scores, lengths) - tau
        if abs(gap) < 1e-3:
            break
        lo, hi = (sigma, hi) if gap > 0 else (lo, sigma)
    return scores


def probe_then_rank(arrival, s, o, scores, probe_tokens, config):
    """A burst served with a probe phase, emulated as two jobs per request in one simulation: a probe
    of min(o, K) tokens (every probe ahead of every continuation, probes in score order), then, for
    answers longer than K, a continuation of o - K tokens whose prefill recomputes the prompt and the
    K probe tokens (vLLM's recompute preemption), queued by score. A request finishes with its last
    job. Returns (SimResult over the original requests, continuations admitted before their own probe
    finished: where the emulation is optimistic, 0 when every probe wave ends before the queue reaches
    its continuations)."""
    from pipeline.queueing.simulator import SimResult, simulate

    if not (arrival == arrival[0]).all():
        raise ValueError("probe_then_rank emulates a burst only (one arrival time)")
    n, k = o.size, int(probe_tokens)
    cont = np.flatnonzero(o > k)
    jobs = simulate(
        np.concatenate([arrival, arrival[cont]]),
        np.concatenate([s, s[cont] + k]),
        np.concatenate([np.minimum(o, k), o[cont] - k]),
        key=np.concatenate([scores - (scores.max() - scores.min() + 1.0), scores[cont]]),
        config=config,
        sort_running=True,
    )
    finish = jobs.finish[:n].copy()
    finish[cont] = jobs.finish[n:]
    preemptions = jobs.preemptions[:n].copy()
    preemptions[cont] += 1 + jobs.preemptions[n:]
    early = int((jobs.admitted[n:] < jobs.finish[cont]).sum())
    result = SimResult(
        arrival=arrival,
        s=s,
        o=o,
        first_token=jobs.first_token[:n],
        finish=finish,
        admitted=jobs.admitted[:n],
        preemptions=preemptions,
        steps=jobs.steps,
        skipped_steps=jobs.skipped_steps,
        max_used_blocks=jobs.max_used_blocks,
        area=jobs.area,
        series=jobs.series,
    )
    return result, early


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="chatgpt", help="eval model whose val answers are served")
    ap.add_argument(
        "--predictors",
        default="recorded/pairwise,chatgpt/pairwise,chatgpt/pointwise,chatgpt/listwise",
        help="comma-separated <train model>/<method> under models/, or checkpoint directories",
    )
    ap.add_argument("--seed", type=int, default=0, help="which answer sample each request gets")
    ap.add_argument("--out", default=None, help="default metrics/choices/val_serving-<model>.json")
    ap.add_argument(
        "--noise-twins",
        action="store_true",
        help="also serve, for each predictor, log(1 + true length) + Gaussian noise at the predictor's tau_b: "
        "what its ranking quality would buy if its errors were plain noise",
    )
    ap.add_argument(
        "--costliest",
        type=int,
        default=10,
        help="list each predictor's N requests with the largest excess over oracle (0: none)",
    )
    ap.add_argument(
        "--blend-weights",
        type=comma_numbers(float, minimum=0.0),
        default=[],
        help="comma-separated weights W in [0, 1] of the predictor's part: also serve each decoder blend "
        "re-weighted (see above)",
    )
    ap.add_argument(
        "--probe-tokens",
        type=comma_numbers(int, minimum=1),
        default=[],
        help="comma-separated K: also serve each predictor after a probe phase of K tokens per request",
    )
    args = ap.parse_args(argv)
    if any(w > 1 for w in args.blend_weights):
        ap.error(f"--blend-weights {args.blend_weights}: each weight must be in [0, 1]")

    from pipeline.queueing.simulator import EngineConfig, burst, simulate
    from pipeline.serving.scorer import Scorer, score_together
    from pipeline.simulate import summarise

    names = [n.strip() for n in args.predictors.split(",") if n.strip()]
    dirs = [checkpoint_dir(n) for n in names]
    for path in [prompts_path(), generations_path(args.model)] + [d / "pars.json" for d in dirs]:
        if not path.is_file():
            sys.exit(f"val_serving: {path} not found (run `dvc repro`, or check --model / --predictors)")
    if args.blend_weights and not any((d / DECODER_SUBDIR).is_dir() for d in dirs):
        ap.error("--blend-weights: none of --predictors is a decoder blend (a checkpoint with decoder/)")
    prompts = pd.read_parquet(prompts_path()).drop_duplicates("prompt_id").set_index("prompt_id")
    gens = pd.read_parquet(generations_path(args.model))
    val_ids = prompts.index[prompts.split == "val"]
    g = gens[gens.prompt_id.isin(val_ids) & (gens.output_tokens > 0) & (gens.prompt_tokens > 0)]
    # one answer sample per prompt, drawn with the seed (ChatGPT has one per prompt)
    rng = np.random.default_rng(args.seed)
    req = g.groupby("prompt_id", sort=True).sample(n=1, random_state=rng).reset_index(drop=True)
    s, o = req.prompt_tokens.to_numpy(np.int64), req.output_tokens.to_numpy(np.int64)
    texts = prompts.loc[req.prompt_id, "prompt"].tolist()
    print(f"val_serving: {len(req)} val prompts of {args.model}; scoring with {', '.join(names)}", flush=True)
    scorers = [Scorer.from_pretrained(d) for d in dirs]
    keys = {"fcfs": None, "oracle": o.astype(np.float64)}
    keys.update(zip(names, (np.asarray(x, dtype=np.float64) for x in score_together(scorers, texts, progress=True))))

    blends = {}
    for name, scorer in zip(names, scorers):
        if args.blend_weights and scorer.decoder is not None:
            base_score = np.empty(len(texts))  # the fine-tuned predictor's score: what the decoder prior is added to
            for rows, part in scorer.score_parts(texts, with_decoder=False):
                base_score[rows] = part
            # the blend is score_weight * base + decoder_weight * head: the head's part without a second read
            _, score_weight, decoder_weight = scorer.decoder
            if decoder_weight == 0:
                sys.exit(f"val_serving: {name}: its decoder weight is 0 (the blend chose the predictor alone)")
            head_score = (keys[name] - score_weight * base_score) / decoder_weight
            w_chosen = scorer.meta["decoder"].get("w")
            blends[name] = {"w": w_chosen, "score_weight": score_weight, "decoder_weight": decoder_weight}
            for w in args.blend_weights:
                keys[f"{name} (w {w:g})"] = w * zscore(base_score) + (1 - w) * zscore(head_score)

    if args.noise_twins:
        for name in names:
            keys[f"{name} (noise twin)"] = noise_twin(o, kendall_tau_b(keys[name], o), args.seed)

    cfg = EngineConfig.from_dict(load_params("simulate")["engine"])
    arrival = burst(len(req))
    results = {
        name: simulate(
            arrival, s, o, key=arrival.copy() if key is None else key, config=cfg, sort_running=on_pars_scheduler(name)
        )
        for name, key in keys.items()
    }
    probe_early = {}
    for name in names:
        for k in args.probe_tokens:
            label = f"{name} (probe {k})"
            results[label], probe_early[label] = probe_then_rank(arrival, s, o, keys[name], k, cfg)
            keys[label] = keys[name]  # the same order after the probe: tau_b is the predictor's
    # FCFS in a burst serves in arrival order: that order's tau (as pars simulate reports it)
    taus = {name: kendall_tau_b(np.arange(o.size) if key is None else key, o) for name, key in keys.items()}
    rows = summarise(results, taus)
    for label, early in probe_early.items():
        rows[label]["continuations_admitted_before_their_probe_ended"] = early
    # where each order loses to oracle SJF: its excess mean per-token latency split by true answer
    # length (the buckets sum to the policy's mean minus oracle's); a short answer served late weighs
    # most per request (its wait is divided by few tokens)
    bucket = np.digitize(o, LENGTH_EDGES[1:-1], right=True)
    base = results["oracle"].per_token
    for name, res in results.items():
        excess = (res.per_token - base) / o.size
        rows[name]["excess_over_oracle_by_answer_tokens"] = {
            label: {"requests": int((bucket == i).sum()), "excess_s_per_token": float(excess[bucket == i].sum())}
            for i, label in enumerate(LENGTH_LABELS)
        }
        if keys[name] is not None and name != "oracle" and args.costliest > 0:
            # the few requests a mean per-token latency hangs on: where the order put them, what they said
            top = np.argsort(-excess, kind="stable")[: args.costliest]
            percentile = rankdata(keys[name]) / o.size
            rows[name]["costliest_requests"] = {
                "share_of_excess": float(excess[top].sum() / excess.sum()) if excess.sum() > 0 else None,
                "requests": [
                    {
                        "prompt_id": str(req.prompt_id[i]),
                        "answer_tokens": int(o[i]),
                        "score_percentile": round(float(percentile[i]), 3),
                        "excess_s_per_token": float(excess[i]),
                        "answer_start": str(req.text[i])[:40],
                    }
                    for i in top
                ],
            }
    print(f"\n{'policy':<40} {'tau_b':>6} {'mean x':>7} {'p90 x':>7} {'x oracle':>8}")
    for name, r in rows.items():
        print(
            f"{name:<40} {r['kendall_tau_b']:>6.3f} {r['speedup_mean_over_fcfs']:>7.2f} "
            f"{r['speedup_p90_over_fcfs']:>7.2f} {1 + r['gap_mean_to_oracle']:>8.2f}"
        )
    out = write_json(
        {
            "eval_model": args.model,
            "split": "val",
            "requests": int(len(req)),
            "scenario": "burst of every val prompt at t = 0, simulate.engine settings",
            "command": "python benchmarks/val_serving.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "policies": rows,
            **({"blends": blends} if blends else {}),
        },
        args.out or f"metrics/choices/val_serving-{args.model}.json",
    )
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
