"""`pars simulate`: replay this project's test prompts through the KV-bound serving simulator and
compare queue policies (FCFS, PARS, pointwise, listwise, oracle SJF, random), workload by workload.

A workload (params `simulate.workloads`) is the test-split prompts of one generation model with
their real prompt and answer lengths: each request takes ONE sampled answer of its prompt (drawn at
random, seeded), never the mean over samples that the predictors were scored against, so the oracle
knows the true length and the predictors do not. A burst takes distinct prompts when the workload
has enough (ShareGPT/ChatGPT: 3,000+ test prompts); otherwise (SmolLM2: a few dozen) it resamples them
with replacement, each copy drawing its own answer sample. Learned policies rank by the evaluate
stage's scores (data/scores/scores.parquet) of the predictors named in the workload's `score_model`;
a missing score file skips those policies, and the output says so; a score_model naming a train
model or method the file lacks is refused.

`quality_curve` adds, for one workload's burst, the serving speedup of scores with a known ranking
quality: log(true length) plus Gaussian noise of each given sigma, and the tau_b that noise gives.

Writes metrics/simulation.json (`workloads.<name>.scenarios.<scenario>.<policy>`) and
plots/simulation/*.png (or --out and --plots), after every input is checked and every workload has
run. A --workload subset must write elsewhere: the stage's outputs hold every workload.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.contracts import (
    GENERATION_COUNTS,
    PROMPTS,
    SCORES,
    ensure_parent,
    generations_path,
    prompts_path,
    read_table,
    same_file,
    scores_path,
    write_figure,
    write_json,
)
from pipeline.errors import PARSError
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.queueing import theory as th
from pipeline.queueing.policies import POLICIES, SCORE_METHODS, on_pars_scheduler, policy_key
from pipeline.ranking.labels import check_generations
from pipeline.ranking.metrics import kendall_tau_b

METRICS = Path("metrics/simulation.json")
PLOTS = Path("plots/simulation")
ORDER = POLICIES


def load_requests(
    model: str, score_model: str | dict[str, str], data_root: str | Path = "data", scores_file: str | Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Test prompts with their answer samples, and a (prompt_id x policy) score table.

    `score_model` names the predictors: one train model for every learned policy, or a mapping
    policy -> train model (e.g. pars from the cross-model export, pointwise from a per-model one).
    A train model written "<train model>/<method>" takes that method's scores instead of the
    policy's own (e.g. pars from the blended checkpoint, recorded/pairwise+tfidf).

    Returns (samples: prompt_id, sample, s, o), (scores: prompt_id -> one column per policy),
    and notes on what is missing."""
    prompts = read_table(prompts_path(data_root), PROMPTS)
    gens = read_table(generations_path(model, data_root), GENERATION_COUNTS)
    # a null or negative length would otherwise be dropped below without a word
    check_generations(gens, where=str(generations_path(model, data_root)))
    test_ids = set(prompts.loc[prompts.split == "test", "prompt_id"])
    g = gens[gens.prompt_id.isin(test_ids) & (gens.output_tokens > 0) & (gens.prompt_tokens > 0)]
    if g.empty:
        raise ValueError(f"{generations_path(model, data_root)} has no answers to test-split prompts")
    samples = pd.DataFrame(
        {
            "prompt_id": g.prompt_id.to_numpy(),
            "sample": g["sample"].to_numpy(),
            "s": g.prompt_tokens.to_numpy(np.int64),
            "o": g.output_tokens.to_numpy(np.int64),
        }
    )
    notes = []
    truncated = float((g.finish_reason == "length").mean())
    if truncated > 0:
        notes.append(f"{truncated:.1%} of answers were cut at max_tokens: their length is a lower bound")

    path = Path(scores_file) if scores_file else scores_path(data_root)
    scores = pd.DataFrame(index=pd.Index(sorted(samples.prompt_id.unique()), name="prompt_id"))
    if not path.is_file():
        notes.append(f"{path} not found (evaluate stage): learned policies pars/pointwise/listwise skipped")
        return samples, scores, notes
    sc = read_table(path, SCORES)
    for policy, method in SCORE_METHODS.items():
        train_model = score_model.get(policy) if isinstance(score_model, dict) else score_model
        if train_model is None:
            notes.append(f"no score_model for policy {policy}: skipped")
            continue
        if "/" in str(train_model):  # "<train model>/<method>": another method's scores (e.g. a blend)
            train_model, method = str(train_model).split("/", 1)
        mine = sc[(sc.train_model == train_model) & (sc.method == method)]
        # a second score of a prompt or a NaN would otherwise rank it silently (first row kept) or fail unnamed
        twice = mine.prompt_id[mine.prompt_id.duplicated()]
        if len(twice):
            raise PARSError(
                f"{path}: train_model={train_model} method={method} scores prompt_id {twice.iloc[0]!r} "
                "more than once"
            )
        bad = mine[~np.isfinite(mine.score.to_numpy(np.float64))]
        if len(bad):
            raise PARSError(
                f"{path}: train_model={train_model} method={method} has a non-finite score "
                f"({bad.score.iloc[0]}) for prompt_id {bad.prompt_id.iloc[0]!r}"
            )
        col = mine.set_index("prompt_id")["score"]
        missing = scores.index.difference(col.index)
        if col.empty:
            notes.append(f"{path} has no {method} scores for train_model={train_model}: policy {policy} skipped")
        elif len(missing):
            notes.append(f"{method} scores miss {len(missing)} test prompts: policy {policy} skipped")
        else:
            scores[policy] = col.reindex(scores.index).astype(float)
    return samples, scores, notes


def check_score_models(workloads: dict[str, Any], where: str, data_root: str | Path) -> None:
    """Every train model (and <train model>/<method>) a workload's score_model names has scores in
    the evaluate stage's file: a typo would otherwise only drop its policy, with a note. Left to a
    note (load_requests): no score file yet, and a method that a train model given for every policy
    lacks (a cross-model predictor has pairwise scores only)."""
    path = scores_path(data_root)
    if not path.is_file():
        return
    sc = read_table(path, SCORES)
    methods = {str(tm): set(group) for tm, group in sc.groupby("train_model")["method"]}
    for name, w in workloads.items():
        score_model = w["score_model"]
        named = score_model.items() if isinstance(score_model, dict) else [(None, score_model)]
        for policy, value in named:
            key = f"{where}.workloads.{name}.score_model" + (f".{policy}" if policy is not None else "")
            train_model, _, method = str(value).partition("/")
            if train_model not in methods:
                raise PARSError(
                    f"{key} {value!r}: {path} has no scores of train model {train_model!r} "
                    f"(known: {', '.join(sorted(methods))})"
                )
            method = method or (SCORE_METHODS[policy] if policy is not None else "")
            if method and method not in methods[train_model]:
                raise PARSError(
                    f"{key} {value!r}: {path} has no {method!r} scores of train model {train_model!r} "
                    f"(its methods: {', '.join(sorted(methods[train_model]))})"
                )


# arrival times are seconds: beyond this (about 3,000 years) they are milliseconds or not times
MAX_TRACE_S = 1e11
# engine sizes (tokens, requests): beyond any machine, and int64 arithmetic in the kernel stays exact
MAX_ENGINE = 10**12
# the file names plots() writes, <workload>_<kind>.png: the only files a run replaces or removes
PLOT_KINDS = ("latency_cdf", "burst_queue", "speedup_vs_load", "speedup_vs_tau")


def read_trace(path: str | Path) -> np.ndarray:
    """Arrival times in seconds (any order; the simulator shifts them to start at 0): one number
    a line (blank lines and # comments skipped), or a CSV/parquet column `arrival`. Anything else
    (not a number, NaN, infinite, negative, milliseconds) is refused in one line naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"arrival trace {path} not found")
    if path.suffix in (".parquet", ".csv"):
        try:
            df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        except Exception as exc:  # pandas/pyarrow raise many types for a damaged file
            raise PARSError(
                f"arrival trace {path}: not a readable {path.suffix[1:]} file " f"({exc.__class__.__name__}: {exc})"
            ) from None
        if "arrival" not in df.columns:
            raise PARSError(f"arrival trace {path}: no column 'arrival' (columns: {list(df.columns)[:10]})")
        values = list(df["arrival"])
        # a CSV row's file line (after the header); a parquet row's 0-based index
        where = [f"{path}:{i + 2}" if path.suffix == ".csv" else f"{path}: row {i}" for i in range(len(values))]
    else:
        values, where = [], []
        for lineno, raw in enumerate(path.read_bytes().splitlines(), 1):
            try:
                text = raw.decode("utf-8").split("#", 1)[0].strip()
            except UnicodeDecodeError:
                raise PARSError(f"arrival trace {path}:{lineno}: not valid UTF-8") from None
            if text:
                values.append(text)
                where.append(f"{path}:{lineno}")
    times = np.empty(len(values), dtype=np.float64)
    for i, (value, at) in enumerate(zip(values, where)):
        try:
            t = float(value) if not isinstance(value, bool) else float("nan")
        except (TypeError, ValueError):
            t = float("nan")
        if not 0 <= t <= MAX_TRACE_S:  # also NaN
            raise PARSError(
                f"arrival trace {at}: {str(value)[:40]!r} is not a time in seconds "
                f"(a number from 0 to {MAX_TRACE_S:g})"
            )
        times[i] = t
    if times.size == 0:
        raise PARSError(f"arrival trace {path}: no arrival times")
    return times


def check_params(p: dict[str, Any], where: str) -> None:
    """The simulate section's numbers, named on a defect: an infinite load or a burst of -1
    requests would otherwise end in a crash deep in the simulator, or in a meaningless table."""

    def count(value: Any, key: str, minimum: int = 1, maximum: int | None = None) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PARSError(f"{where}.{key} {value!r}: expected a whole number >= {minimum}")
        if maximum is not None and value > maximum:
            raise PARSError(f"{where}.{key} {value!r}: expected a whole number <= {maximum:g}")

    def number(value: Any, key: str, positive: bool) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not np.isfinite(value)
            or value < 0
            or (positive and value == 0)
        ):
            raise PARSError(f"{where}.{key} {value!r}: expected a finite number {'> 0' if positive else '>= 0'}")

    Section(p, where).only(
        ("workloads", "quality_curve", "policies", "burst", "poisson_loads", "poisson_requests", "seed", "engine")
    )
    workloads = p["workloads"]
    if not isinstance(workloads, dict) or not workloads:
        raise PARSError(f"{where}.workloads {workloads!r}: expected a mapping of workload name to its settings")
    for name, w in workloads.items():
        if not isinstance(w, dict) or not isinstance(w.get("model"), str) or not w["model"]:
            raise PARSError(f"{where}.workloads.{name}: expected {{model: <generation model>, score_model: ...}}")
        Section(w, f"{where}.workloads.{name}").only(("model", "score_model"))
        score_model = w.get("score_model")
        named = score_model.items() if isinstance(score_model, dict) else [(None, score_model)]
        for policy, train_model in named:
            key = f"workloads.{name}.score_model" + (f".{policy}" if policy is not None else "")
            if policy is not None and policy not in SCORE_METHODS:
                raise PARSError(f"{where}.{key}: {policy!r} is not a learned policy ({', '.join(SCORE_METHODS)})")
            if not isinstance(train_model, str) or not train_model:
                raise PARSError(
                    f"{where}.{key} {train_model!r}: expected a train model (or <train model>/<method>)"
                    + (", or a mapping of policy to one" if policy is None else "")
                )
    count(p["burst"], "burst")
    count(p["poisson_requests"], "poisson_requests")
    count(p["seed"], "seed", minimum=0)
    curve = p.get("quality_curve") or {}
    if not isinstance(curve, dict):
        raise PARSError(f"{where}.quality_curve {curve!r}: expected {{workload: ..., noise_sigma: [...]}} or null")
    Section(curve, f"{where}.quality_curve").only(("workload", "noise_sigma"))
    # null is not an empty list here: the run would fail on it after minutes of simulation
    lists = [("poisson_loads", p["poisson_loads"]), ("policies", p["policies"])]
    if curve:
        lists.append(("quality_curve.noise_sigma", curve.get("noise_sigma")))
    for key, values in lists:
        if not isinstance(values, list):
            raise PARSError(f"{where}.{key} {values!r}: expected a list")
    for i, load in enumerate(p["poisson_loads"]):
        number(load, f"poisson_loads[{i}]", positive=True)
    for i, sigma in enumerate(curve.get("noise_sigma") or []):
        number(sigma, f"quality_curve.noise_sigma[{i}]", positive=False)
    if curve and (not isinstance(curve.get("workload"), str) or curve["workload"] not in workloads):
        raise PARSError(
            f"{where}.quality_curve.workload {curve.get('workload')!r} is not one of "
            f"simulate.workloads {sorted(p.get('workloads') or {})}"
        )
    if not p["policies"]:  # would run fcfs alone (always added) and compare nothing; [fcfs] says so on purpose
        raise PARSError(
            f"{where}.policies {p['policies']!r}: expected a list of policies to compare (known: {', '.join(POLICIES)})"
        )
    unknown = sorted(str(x) for x in set(map(str, p["policies"])) - set(POLICIES))
    if unknown:
        raise PARSError(f"{where}.policies: unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
    engine = p["engine"]
    if not isinstance(engine, dict):
        raise PARSError(f"{where}.engine: expected a mapping of engine settings, got {engine!r}")
    from pipeline.queueing.simulator import EngineConfig

    Section(engine, f"{where}.engine").only(EngineConfig.__dataclass_fields__)
    for key in ("M", "chunk", "token_budget", "max_num_seqs", "block_size"):
        if key in engine:
            count(engine[key], f"engine.{key}", maximum=MAX_ENGINE)
    setting = {k: engine.get(k, getattr(EngineConfig, k)) for k in EngineConfig.__dataclass_fields__}
    problem = th.engine_shape_problem(*(setting[k] for k in ("M", "token_budget", "max_num_seqs", "block_size")))
    if problem:
        raise PARSError(f"{where}.engine: {problem}")
    if not isinstance(setting["first_token_at_prefill"], bool):  # "false" would read as true
        raise PARSError(
            f"{where}.engine.first_token_at_prefill {setting['first_token_at_prefill']!r}: expected true or false"
        )
    if "step_c0" in engine:
        number(engine["step_c0"], "engine.step_c0", positive=True)
    if "step_c1" in engine:
        number(engine["step_c1"], "engine.step_c1", positive=False)
    starve = engine.get("starvation_s")
    if starve is not None and (isinstance(starve, bool) or not isinstance(starve, (int, float)) or not starve > 0):
        raise PARSError(f"{where}.engine.starvation_s {starve!r}: expected seconds > 0 (null: no starvation rule)")


def draw(samples: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """n requests: distinct test prompts when there are at least n (else drawn with replacement),
    each with one of its answer samples at random."""
    prompts = np.array(sorted(samples.prompt_id.unique()))
    pick = rng.choice(prompts, size=n, replace=n > len(prompts))
    by_prompt = {pid: grp.index.to_numpy() for pid, grp in samples.groupby("prompt_id")}
    rows = np.array([rng.choice(by_prompt[p]) for p in pick])
    return samples.loc[rows].reset_index(drop=True)


def run_policies(
    req: pd.DataFrame, arrival: np.ndarray, scores: pd.DataFrame, policies: list[str], cfg, seed: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """Each policy's simulation, and the tau_b of its key against the true lengths: the ranking
    quality it had on these very requests."""
    from pipeline.queueing.simulator import simulate

    s, o = req.s.to_numpy(), req.o.to_numpy()
    results, taus = {}, {}
    for policy in policies:
        sc = scores[policy].reindex(req.prompt_id).to_numpy() if policy in SCORE_METHODS else None
        key = policy_key(policy, arrival, o, sc, rng=np.random.default_rng(seed))
        results[policy] = simulate(arrival, s, o, key=key, config=cfg, sort_running=on_pars_scheduler(policy))
        tau = kendall_tau_b(key, o)
        # a constant key (FCFS in a burst) is served in arrival order: that order's tau
        taus[policy] = tau if np.isfinite(tau) else kendall_tau_b(np.arange(o.size), o)
    return results, taus


def summarise(results: dict[str, Any], taus: dict[str, float]) -> dict[str, dict[str, float]]:
    table = {p: {**r.summary(), "kendall_tau_b": taus[p]} for p, r in results.items()}
    base, orac = table["fcfs"], table.get("oracle")
    for row in table.values():
        for stat in ("mean", "p90"):
            k = f"{stat}_per_token_latency"
            row[f"speedup_{stat}_over_fcfs"] = base[k] / row[k]
            if orac:
                row[f"gap_{stat}_to_oracle"] = (row[k] - orac[k]) / orac[k]
    return table


def quality_curve(req: pd.DataFrame, arrival: np.ndarray, cfg, noise: list[float], seed: int) -> list[dict]:
    """Serving speedup of scores of known ranking quality: log(1 + true length) + sigma * z, z ~ N(0, 1).

    One point per sigma: the tau_b of those scores against the true lengths (the project's tau_b),
    and the burst's mean and p90 per-token latency speedup over FCFS. sigma 0 is the oracle. One z
    (seeded) serves every sigma, so the points differ only by sigma, not by the noise draw."""
    from pipeline.queueing.simulator import simulate

    s, o = req.s.to_numpy(), req.o.to_numpy()
    fcfs = simulate(arrival, s, o, key=policy_key("fcfs", arrival, o), config=cfg).summary()
    z = np.random.default_rng(seed).standard_normal(o.size)
    points = []
    for sigma in noise:
        scores = np.log1p(o) + float(sigma) * z
        row = simulate(arrival, s, o, key=scores, config=cfg, sort_running=on_pars_scheduler("pars")).summary()
        points.append(
            {
                "noise_sigma": float(sigma),
                "kendall_tau_b": kendall_tau_b(scores, o),
                "speedup_mean_over_fcfs": fcfs["mean_per_token_latency"] / row["mean_per_token_latency"],
                "speedup_p90_over_fcfs": fcfs["p90_per_token_latency"] / row["p90_per_token_latency"],
            }
        )
    return points


def plots(
    name: str,
    burst_results: dict[str, Any],
    sweep: dict[float, dict],
    curve: list[dict] | None,
    measured: dict[str, dict] | None,
    kv_tokens: int | None = None,
    outdir: Path = PLOTS,
) -> list[Path]:
    """The workload's figures in `outdir`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig, kind: str) -> None:
        path = write_figure(fig, outdir / f"{name}_{kind}.png", dpi=120)
        plt.close(fig)
        written.append(path)

    color = dict(zip(ORDER, plt.cm.tab10.colors))  # one colour per policy in every plot
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in ORDER:
        if p in burst_results:
            x = np.sort(burst_results[p].per_token)
            ax.plot(x, np.arange(1, x.size + 1) / x.size, label=p, color=color[p])
    ax.set_xscale("log")
    ax.set_xlabel("per-token latency (s/token)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{name}: per-token latency CDF, burst")
    ax.legend()
    fig.tight_layout()
    save(fig, "latency_cdf")

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for p in ORDER:
        if p in burst_results:
            ser = burst_results[p].series
            ax[0].plot(ser["t"], ser["waiting"], label=p, lw=0.8, color=color[p])
            ax[1].plot(ser["t"], ser["kv_tokens"], label=p, lw=0.5, color=color[p])
    if kv_tokens:
        ax[1].axhline(kv_tokens, color="black", ls="--", lw=0.8, label=f"KV cache (M = {kv_tokens:,})")
    ax[0].set_title(f"{name}: burst, requests still waiting")
    ax[0].set_ylabel("waiting requests")
    ax[1].set_title(f"{name}: burst, KV cache held")
    ax[1].set_ylabel("KV tokens in use")
    for a in ax:
        a.set_xlabel("time since the burst (s)")
        a.legend(fontsize=7)
    fig.tight_layout()
    save(fig, "burst_queue")

    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        loads = sorted(sweep)
        for p in ORDER:
            if p != "fcfs" and all(p in sweep[x] for x in loads):
                ax.plot(loads, [sweep[x][p]["speedup_mean_over_fcfs"] for x in loads], "o-", label=p, color=color[p])
        ax.axhline(1.0, color="grey", ls=":")
        ax.set_xlabel("load (arrival rate / capacity)")
        ax.set_ylabel("mean per-token latency speedup over FCFS")
        ax.set_title(f"{name}: Poisson arrivals, speedup vs load")
        ax.legend()
        fig.tight_layout()
        save(fig, "speedup_vs_load")

    if curve:
        fig, ax = plt.subplots(figsize=(6, 4))
        tau = [c["kendall_tau_b"] for c in curve]
        ax.plot(tau, [c["speedup_mean_over_fcfs"] for c in curve], "o-", label="mean, noisy true length")
        ax.plot(tau, [c["speedup_p90_over_fcfs"] for c in curve], "s--", label="p90, noisy true length")
        # the learned predictors' scores: one marker each, filled for the mean, hollow for p90 (their
        # tau_b are close, so legend entries rather than annotations that overlap)
        for (policy, row), marker in zip((measured or {}).items(), "*DPXv^"):
            ax.plot(
                [row["kendall_tau_b"]],
                [row["speedup_mean_over_fcfs"]],
                marker,
                color="black",
                ms=9,
                label=f"{policy} scores (hollow: p90)",
            )
            ax.plot([row["kendall_tau_b"]], [row["speedup_p90_over_fcfs"]], marker, color="black", mfc="none", ms=9)
        ax.axhline(1.0, color="grey", ls=":")
        ax.set_xlabel("Kendall tau_b of the scores (burst requests)")
        ax.set_ylabel("per-token latency speedup over FCFS")
        ax.set_title(f"{name}: what ranking quality buys (burst)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save(fig, "speedup_vs_tau")
    return written


def load_workload(name: str, w: dict[str, Any], cfg, data_root: str | Path, where: str):
    """load_requests, and a refusal naming the file when its longest request cannot fit in the KV
    cache (found now, not by the simulator after other workloads have run)."""
    samples, scores, notes = load_requests(w["model"], w["score_model"], data_root)
    longest = int((samples.s + samples.o).max())
    if not th.fits_in_cache(longest, cfg.M, cfg.block_size):
        raise PARSError(
            f"{generations_path(w['model'], data_root)}: a request of {longest} tokens (prompt + answer) "
            f"does not fit in the KV cache: {where}.engine.M {cfg.M} (block_size {cfg.block_size}) must be larger"
        )
    return samples, scores, notes


def run_workload(
    name: str, w: dict[str, Any], p: dict[str, Any], cfg, loaded: tuple, times: np.ndarray | None
) -> tuple[dict[str, Any], tuple]:
    """The workload's results, and the arguments of its plots() (drawn once every workload has run)."""
    from tqdm import tqdm

    from pipeline.queueing.simulator import burst, poisson, trace

    seed = int(p["seed"])
    samples, scores, notes = loaded
    notes = list(notes)
    policies = [x for x in p["policies"] if x not in SCORE_METHODS or x in scores.columns]
    if "fcfs" not in policies:
        policies.insert(0, "fcfs")
    n_prompts = samples.prompt_id.nunique()
    wl = th.Workload.empirical(w["model"], samples.s.to_numpy(), samples.o.to_numpy())
    # loads are fractions of the real capacity: memory (mu) or, for short requests, batch slots
    cap = th.capacity(wl, cfg.M, cfg.chunk, float(cfg.step_time(0)), max_num_seqs=cfg.max_num_seqs)
    if cfg.step_c1 > 0:
        notes.append("mu for the load scale uses the step time of an empty step (c0); loads are approximate")
    slots, capacity_rate = cap.slot_rate, cap.limit
    binding = "KV memory (mu)" if cap.bound_by == "KV memory" else f"max_num_seqs={cfg.max_num_seqs} (batch slots)"
    notes.append(f"capacity {capacity_rate:.3f} req/s, bound by {binding}; mu = {cap.mu:.3f}, slot rate = {slots:.3f}")
    for note in notes:
        print(f"{name}: note: {note}")

    n = int(p["burst"])
    rng = np.random.default_rng(seed)
    req = draw(samples, n, rng)
    scen: dict[str, Any] = {}
    print(
        f"{name}: burst of {n} requests from {n_prompts} test prompts ({len(samples)} answers), " f"policies {policies}"
    )
    arrival = burst(n)
    burst_res, taus = run_policies(req, arrival, scores, policies, cfg, seed)
    scen[f"burst_{n}"] = summarise(burst_res, taus)
    for policy, row in scen[f"burst_{n}"].items():
        # a burst's throughput_rps (n / makespan) mostly tracks when its last long request started;
        # the completion rate over the middle 60 % of completions is the engine's rate under load
        row["steady_throughput_rps"] = float(burst_res[policy].steady_throughput())
    curve = None
    if name == (p.get("quality_curve") or {}).get("workload"):
        curve = quality_curve(req, arrival, cfg, list(p["quality_curve"]["noise_sigma"]), seed)

    sweep = {}
    for load in tqdm([float(x) for x in p["poisson_loads"]], desc=f"{name}: poisson loads", unit="load"):
        m = int(p["poisson_requests"])
        sub = draw(samples, m, rng)
        table = summarise(*run_policies(sub, poisson(m, load * capacity_rate, rng), scores, policies, cfg, seed))
        scen[f"poisson_{load:g}"] = table
        sweep[load] = table
    if times is not None:
        # a recorded arrival trace: one arrival time (seconds) per line, or a parquet/CSV column `arrival`
        sub = draw(samples, times.size, rng)
        scen["trace"] = summarise(*run_policies(sub, trace(times), scores, policies, cfg, seed))
    measured = {x: scen[f"burst_{n}"][x] for x in policies if x in SCORE_METHODS}
    out = {
        "model": w["model"],
        "score_model": w["score_model"],
        "test_prompts": int(n_prompts),
        "answers": int(len(samples)),
        "policies": policies,
        "notes": notes,
        "resampled": n > n_prompts,
        "requests": (
            f"{n_prompts} test prompts resampled with replacement; each request one real answer sample"
            if n > n_prompts
            else f"{n} distinct test prompts; each request one real answer sample"
        ),
        "mu_theory": cap.mu,
        "delta": cap.delta,
        "slot_rate": slots,
        "capacity_rate": capacity_rate,
        "load_unit": f"Poisson loads are fractions of capacity_rate (bound by {binding})",
        "scenarios": scen,
    }
    if curve is not None:
        out["quality_curve"] = curve
    return out, (burst_res, sweep, curve, measured, int(cfg.M))


def run(
    p: dict[str, Any], data_root: str | Path = "data", out_json: str | Path = METRICS, plots_dir: str | Path = PLOTS
) -> dict[str, Any]:
    from pipeline.queueing.simulator import EngineConfig

    cfg = EngineConfig.from_dict(p["engine"])
    where = getattr(p, "where", "simulate")
    # every input is read and checked before the first simulation; the outputs are replaced only
    # at the end, so a run that fails on the way leaves the last good ones
    for w in p["workloads"].values():
        for path in (prompts_path(data_root), generations_path(w["model"], data_root)):
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist (has the stage that writes it run?)")
    loaded = {name: load_workload(name, w, cfg, data_root, where) for name, w in p["workloads"].items()}
    times = read_trace(p["trace"]) if p.get("trace") else None
    workloads, figures = {}, {}
    for name, w in p["workloads"].items():
        workloads[name], figures[name] = run_workload(name, w, p, cfg, loaded[name], times)
    out = {
        "engine": {k: (v if np.isfinite(v) else None) if isinstance(v, float) else v for k, v in cfg.__dict__.items()},
        "workloads": workloads,
    }
    plots_dir = Path(plots_dir)
    written = {path for name, args in figures.items() for path in plots(name, *args, outdir=plots_dir)}
    write_json(out, out_json)
    # then the figures this run did not redraw (a workload renamed or dropped, a curve turned off);
    # only files named as plots() names them: a --plots directory may hold other files
    for old in plots_dir.glob("*.png"):
        if old not in written and old.stem.endswith(tuple(f"_{kind}" for kind in PLOT_KINDS)):
            old.unlink()
    return out


def print_table(name: str, w: dict[str, Any], scenario: str) -> None:
    rows = w["scenarios"][scenario]
    print(f"\n{name} · {scenario}: per-token latency (s/token)")
    print(f"{'policy':10s} {'mean':>9s} {'p90':>9s} {'speedup':>8s} {'p90 spd':>8s} {'vs oracle':>9s}")
    for p in ORDER:
        if p in rows:
            r = rows[p]
            gap = f"{r['gap_mean_to_oracle']:+9.1%}" if "gap_mean_to_oracle" in r else f"{'–':>9s}"  # no oracle run
            print(
                f"{p:10s} {r['mean_per_token_latency']:9.4f} {r['p90_per_token_latency']:9.4f} "
                f"{r['speedup_mean_over_fcfs']:7.2f}x {r['speedup_p90_over_fcfs']:7.2f}x {gap}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pars simulate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", "--data-root", dest="data_root", default="data", help="data root (default: %(default)s)")
    ap.add_argument("--workload", action="append", help="run only this workload of simulate.workloads (repeatable)")
    ap.add_argument("--trace", help="also replay this arrival trace (seconds; text, CSV or parquet column `arrival`)")
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument("--out", default=str(METRICS), help=f"metrics JSON to write (default {METRICS})")
    ap.add_argument("--plots", default=str(PLOTS), help=f"directory of the figures (default {PLOTS})")
    args = ap.parse_args(argv)
    p = load_params("simulate", args.params)
    check_params(p, p.where)
    if args.workload:
        unknown = sorted(set(args.workload) - set(p["workloads"]))
        if unknown:
            ap.error(f"--workload {unknown[0]!r} is not in simulate.workloads {sorted(p['workloads'])}")
        # The stage's outputs hold every workload, from one run of one params section: a partial
        # run writes elsewhere (merging it in could mix results of two engine settings or seeds)
        subset = set(args.workload) != set(p["workloads"])
        stage_outs = [
            flag
            for flag, given, default in (("--out", args.out, METRICS), ("--plots", args.plots, PLOTS))
            if same_file(given, default)
        ]
        if subset and stage_outs:
            raise PARSError(
                f"--workload runs part of simulate.workloads: give {' and '.join(stage_outs)} outside "
                f"{METRICS} and {PLOTS}, which hold every workload"
            )
        p = Section({**p, "workloads": {k: v for k, v in p["workloads"].items() if k in args.workload}}, p.where)
    check_score_models(p["workloads"], p.where, args.data_root)
    ensure_parent(args.out, create=False)
    if Path(args.plots).exists() and not Path(args.plots).is_dir():
        raise PARSError(f"--plots {args.plots}: not a directory")
    if args.trace:
        read_trace(args.trace)  # a bad trace is refused before minutes of simulation, not after
        p = Section({**p, "trace": args.trace}, p.where)
    out = run(p, args.data_root, args.out, args.plots)
    for name, w in out["workloads"].items():
        for scenario in w["scenarios"]:
            print_table(name, w, scenario)
        for point in w.get("quality_curve", []):
            print(
                f"{name}: tau_b {point['kendall_tau_b']:.2f} -> mean {point['speedup_mean_over_fcfs']:.2f}x, "
                f"p90 {point['speedup_p90_over_fcfs']:.2f}x over FCFS"
            )
    print(f"\nwrote {args.out}, {args.plots}/*.png")
    return 0
