"""The sim_fidelity stage on engine-benchmark files made by the simulator itself: with the right step
model its prediction must be exact; with a wrong one the error must show, with the right sign."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

ENGINE = {"M": 4096, "block_size": 16, "blocks": 256, "token_budget": 256, "chunk": 128, "max_num_seqs": 4}


def _bench_file(path, seed: int, c0: float, c1: float, n: int = 60, rate: float = 200.0):
    """An engine_bench.json-shaped record whose 'engine' is the simulator with step model (c0, c1),
    the first token sampled at prefill and PARS scores delivered at `rate` prompts/s."""
    from pipeline.queueing.policies import policy_key
    from pipeline.queueing.simulator import EngineConfig, burst, simulate
    from pipeline.sim_fidelity import score_ready_times

    rng = np.random.default_rng(seed)
    s, o = rng.integers(16, 200, n), rng.integers(4, 120, n)
    scores = np.log(o) + rng.normal(0, 0.5, n)
    arrival = burst(n)
    out = {
        "workload": {"prompt_tokens": s.tolist(), "output_tokens": o.tolist(), "pars_scores": scores.tolist()},
        "setup": {"starvation_s": 120.0},
    }
    for policy in ("fcfs", "pars", "oracle"):
        cfg = EngineConfig(
            M=ENGINE["M"],
            chunk=ENGINE["chunk"],
            token_budget=ENGINE["token_budget"],
            max_num_seqs=ENGINE["max_num_seqs"],
            block_size=ENGINE["block_size"],
            step_c0=c0,
            step_c1=c1,
            starvation_s=math.inf if policy == "fcfs" else 120.0,
            first_token_at_prefill=True,
        )
        ready = score_ready_times(s, rate) if policy == "pars" else None
        r = simulate(
            arrival,
            s,
            o,
            key=policy_key(policy, arrival, o, scores if policy == "pars" else None),
            config=cfg,
            key_ready=ready,
        )
        summary = r.summary()
        out[policy] = {
            **{
                k: summary[k]
                for k in ("mean_per_token_latency", "p90_per_token_latency", "mean_ttft", "throughput_rps")
            },
            "engine": ENGINE,
            "step_fit": {"c0_s": c0, "c1_s_per_token": c1, "r2": 1.0, "steps": int(r.steps)},
            "per_request": {"per_token_latency": r.per_token.tolist(), "ttft": r.ttft.tolist(), "e2e": r.e2e.tolist()},
            "pars_stats": {"num_scored": n, "score_s": n / rate},
        }
    path.write_text(json.dumps(out))
    return path


@pytest.mark.parametrize("validation_c0, exact", [(0.02, True), (0.03, False)])
def test_prediction_exact_with_the_right_step_model(tmp_path, monkeypatch, validation_c0, exact):
    from pipeline import sim_fidelity as stage

    monkeypatch.chdir(tmp_path)
    cal = _bench_file(tmp_path / "cal.json", seed=1, c0=0.02, c1=1e-4)
    val = _bench_file(tmp_path / "val.json", seed=2, c0=validation_c0, c1=1e-4)
    out = stage.run({"calibration": str(cal), "validation": str(val)})
    assert out["step_model"]["c0_s"] == pytest.approx(0.02)
    saved = json.loads((tmp_path / "metrics/sim_fidelity.json").read_text())
    for policy in ("fcfs", "pars", "oracle"):
        err = saved[policy]["rel_error"]["mean_per_token_latency"]
        if exact:
            assert abs(err) < 1e-9
        else:  # the engine was slower than the calibration says: the simulator under-predicts
            assert err < -0.05
    assert (tmp_path / "plots/sim_fidelity.png").is_file()
    assert saved["speedup_fcfs_over_pars"]["mean_per_token_latency"]["engine"] > 1.0


def test_late_scores_arrive_shortest_prompts_first_batch_by_batch():
    from pipeline.sim_fidelity import score_ready_times

    tokens = np.array([50, 10, 40, 20, 30])
    ready = score_ready_times(tokens, rate=10.0, batch_size=2, chunk_batches=2)
    # chunk [50, 10, 40, 20] sorted: 10, 20 (ready 0.2 s), 40, 50 (0.4 s); then chunk [30] (0.5 s)
    np.testing.assert_allclose(ready, [0.4, 0.2, 0.4, 0.2, 0.5])


def test_same_burst_twice_is_refused(tmp_path, monkeypatch):
    from pipeline import sim_fidelity as stage

    monkeypatch.chdir(tmp_path)
    f = _bench_file(tmp_path / "b.json", seed=1, c0=0.02, c1=0.0)
    with pytest.raises(ValueError, match="same burst"):
        stage.run({"calibration": str(f), "validation": str(f)})
    (tmp_path / "old.json").write_text(json.dumps({"fcfs": {}, "pars": {}, "oracle": {}}))
    with pytest.raises(ValueError, match="per-request"):
        stage.run({"calibration": str(tmp_path / "old.json"), "validation": str(f)})
    # a missing file names its key and the run that writes it
    with pytest.raises(FileNotFoundError, match=r"sim_fidelity.calibration nope.json: not found; run .*--seed 1"):
        stage.run({"calibration": "nope.json", "validation": str(f)})


def test_bursts_from_two_machines_are_refused(tmp_path, monkeypatch):
    from pipeline import sim_fidelity as stage

    monkeypatch.chdir(tmp_path)
    cal = _bench_file(tmp_path / "cal.json", seed=1, c0=0.02, c1=1e-4)
    val = _bench_file(tmp_path / "val.json", seed=2, c0=0.02, c1=1e-4)

    def on(path, cpu, bf16):
        data = json.loads(path.read_text())
        data["setup"]["machine"] = {"cpu": cpu, "cores": 2, "native_bf16": bf16}
        path.write_text(json.dumps(data))

    on(cal, "Intel Xeon", True)
    on(val, "AMD EPYC", False)
    with pytest.raises(ValueError, match="different machines"):
        stage.run({"calibration": str(cal), "validation": str(val)})
    on(val, "Intel Xeon", True)  # one machine: the stage runs
    assert stage.run({"calibration": str(cal), "validation": str(val)})["requests"] == 60
