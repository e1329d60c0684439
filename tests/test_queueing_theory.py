"""Queueing theory of document 003: g(s, o), mu, delta, verdicts, replicas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.queueing import theory as th


def brute_g(s: int, o: int, chunk: int) -> int:
    """Step-by-step memory area: chunk k holds min(k*chunk, s); decode step j holds s + j."""
    area, held = 0, 0
    while held < s:
        held = min(held + chunk, s)
        area += held
    for j in range(1, o + 1):
        area += s + j
    return area


def test_g_hand_computed():
    # s = 1024, chunk 512: chunks hold 512 and 1024 -> 1536; 3 decode steps: 1025+1026+1027 = 3078
    assert th.g(1024, 3, 512) == 1536 + 3078
    # s = 10 (one partial chunk holding 10), o = 1: 10 + 11
    assert th.g(10, 1, 512) == 21
    # s = 600: chunks hold 512, 600 -> 1112; o = 2: 601 + 602
    assert th.g(600, 2, 512) == 1112 + 1203


def test_g_equals_document_formula_when_chunk_divides_s():
    chunk = 512
    for s in (512, 1024, 2048):
        for o in (1, 7, 1600):
            doc = sum(k * chunk for k in range(1, s // chunk + 1)) + sum(s + j for j in range(1, o + 1))
            assert th.g(s, o, chunk) == doc


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 3000), st.integers(1, 1024))
def test_g_matches_step_by_step(s, o, chunk):
    assert th.g(s, o, chunk) == brute_g(s, o, chunk)


def test_expected_g_uniform_is_exact():
    w = th.Workload.uniform("t", 10, 40, 5, 20)
    s, o = np.meshgrid(np.arange(10, 41), np.arange(5, 21))
    assert w.expected_g(16) == pytest.approx(th.g(s.ravel(), o.ravel(), 16).mean(), rel=1e-12)


def test_mu_formula_and_delta():
    w = th.Workload.empirical("e", [100, 300], [50, 150])
    eg = (th.g(100, 50, 64) + th.g(300, 150, 64)) / 2
    cap = th.capacity(w, M=10_000, chunk=64, step_time=0.02)
    assert cap.expected_g == pytest.approx(eg)
    assert cap.mu == pytest.approx(10_000 / (0.02 * eg))
    assert cap.delta == pytest.approx(450 / 10_000)
    assert cap.stable_below == pytest.approx(cap.mu * (1 - 450 / 10_000))


def test_document_workloads():
    ws = th.document_workloads()
    assert set(ws) == {"1:1", "2:1", "1:2", "mixed"}
    assert ws["1:1"].ess_sup() == 3200 and ws["2:1"].ess_sup() == 3199
    mixed = ws["mixed"].expected_g(512)
    parts = [ws[k].expected_g(512) for k in ("1:1", "2:1", "1:2")]
    assert mixed == pytest.approx(np.mean(parts))
    # longer answers cost more memory-time than longer prompts of the same total
    assert ws["1:2"].expected_g(512) > ws["1:1"].expected_g(512) > ws["2:1"].expected_g(512)


def test_verdicts():
    cap = th.capacity(th.Workload.empirical("e", [1000], [1000]), M=20_000, chunk=512, step_time=0.05)
    assert cap.delta == pytest.approx(0.1)
    assert th.verdict(cap.mu * 1.01, cap) == th.UNSTABLE
    assert th.verdict(cap.mu * 0.95, cap) == th.UNDECIDED  # between mu(1-delta) and mu
    assert th.verdict(cap.mu * 0.89, cap) == th.STABLE


def test_request_larger_than_memory_is_rejected():
    with pytest.raises(ValueError):
        th.capacity(th.Workload.empirical("e", [900], [200]), M=1000, chunk=512, step_time=0.05)


def test_replicas_needed():
    cap = th.capacity(th.Workload.empirical("e", [1000], [1000]), M=20_000, chunk=512, step_time=0.05)
    per = 0.9 * cap.stable_below
    r = th.replicas_needed(3.5 * per, cap, margin=0.1)
    assert r["guaranteed"] == 4
    assert r["minimum"] == math.ceil(3.5 * per / cap.mu)
    assert r["per_replica_rate"] <= per + 1e-12
    assert th.replicas_needed(per, cap, margin=0.1)["guaranteed"] == 1
    assert th.replicas_needed(0.0, cap)["guaranteed"] == 1


@pytest.mark.parametrize("max_num_seqs", [None, 4])
def test_guaranteed_replicas_stay_strictly_below_the_bound_with_no_margin(max_num_seqs):
    """With margin 0 a rate that is a whole multiple of the safe rate would load each replica exactly
    to it, where the theorem (strict) guarantees nothing and the slot bound says unstable."""
    w = th.Workload.empirical("e", [64, 64], [16, 48])
    cap = th.capacity(w, M=100_000, chunk=64, step_time=0.01, max_num_seqs=max_num_seqs)
    r = th.replicas_needed(2 * cap.safe_below, cap, margin=0.0)
    assert r["guaranteed"] == 3 and r["guaranteed"] >= r["minimum"]
    assert th.verdict(r["per_replica_rate"], cap) == th.STABLE


def test_batch_slots_bound_capacity_when_they_saturate_first():
    """Short requests: the 4 slots saturate before the KV memory; the verdict and the replicas use
    min(mu, slot rate), and without max_num_seqs the memory theorem alone applies as before."""
    w = th.Workload.empirical("e", [64, 64], [16, 48])  # ceil(64/64) + o: 17 and 49 steps, mean 33
    memory_only = th.capacity(w, M=100_000, chunk=64, step_time=0.01)
    cap = th.capacity(w, M=100_000, chunk=64, step_time=0.01, max_num_seqs=4)
    assert cap.slot_rate == pytest.approx(4 / (0.01 * 33))
    assert cap.slot_rate < cap.mu and cap.bound_by == "batch slots"
    assert cap.limit == pytest.approx(cap.slot_rate) and cap.safe_below == pytest.approx(cap.slot_rate)
    rate = 1.5 * cap.slot_rate  # far under the memory bound, over the slot rate
    assert th.verdict(rate, memory_only) == th.STABLE
    assert th.verdict(rate, cap) == th.UNSTABLE
    assert th.verdict(0.9 * cap.slot_rate, cap) == th.STABLE
    r = th.replicas_needed(rate, cap, margin=0.1)
    assert r["minimum"] == 2 and r["guaranteed"] == math.ceil(rate / (0.9 * cap.slot_rate))
    assert r["bound_by"] == "batch slots" and r["utilisation"] == pytest.approx(
        rate / (r["guaranteed"] * cap.slot_rate)
    )
    assert th.replicas_needed(rate, memory_only, margin=0.1)["guaranteed"] == 1
    roomy = th.capacity(w, M=100_000, chunk=64, step_time=0.01, max_num_seqs=10_000)
    assert roomy.bound_by == "KV memory" and roomy.limit == roomy.mu and roomy.safe_below == roomy.stable_below


def test_parse_distribution():
    assert th.parse_distribution("uniform:10:1600") == (10, 1600)
    assert th.parse_distribution("10:20") == (10, 20)
    with pytest.raises(ValueError):
        th.parse_distribution("normal:1:2:3")


def test_capacity_cli_answers_in_words(capsys):
    from helpers import PARAMS, params_section

    from pipeline import capacity

    # flags left unset take params.yaml's capacity section (document 003's A100 setting)
    assert capacity.main(["--rate", "12", "--workload", "1:1", "--json", "--params", str(PARAMS)]) == 0
    out = capsys.readouterr().out
    p = params_section("capacity")
    cap = th.capacity(th.document_workloads()["1:1"], p["M"], p["chunk"], p["step_time"])
    assert f"mu = {cap.mu:.3f}" in out and "unstable" in out
    r = th.replicas_needed(12, cap, p["margin"])
    assert f"{r['guaranteed']} with a {p['margin']:.0%} safety margin" in out
    assert (
        capacity.main(
            [
                "--rate",
                "0.5",
                "--prompt",
                "uniform:10:100",
                "--answer",
                "10:100",
                "--M",
                "5000",
                "--step-time",
                "0.02",
                "--params",
                str(PARAMS),
            ]
        )
        == 0
    )
    assert "(stable)" in capsys.readouterr().out


def test_slot_rate():
    w = th.Workload.empirical("e", [100, 700], [10, 30])
    # mean steps = (1 + 10 + 2 + 30) / 2 = 21.5 with chunk 512
    assert th.slot_rate(w, 8, 512, 0.1) == pytest.approx(8 / (0.1 * 21.5))


def test_fit_step_time_known_values():
    from pipeline.queueing.theory import fit_step_time

    tokens = np.array([0, 10, 20, 30, 40])
    seconds = 0.02 + 0.001 * tokens  # an idle step (0 tokens) is left out of the fit
    seconds[0] = 5.0
    fit = fit_step_time(seconds, tokens)
    assert fit["c0_s"] == pytest.approx(0.02) and fit["c1_s_per_token"] == pytest.approx(0.001)
    assert fit["r2"] == pytest.approx(1.0) and fit["steps"] == 4
    assert fit_step_time([0.1, 0.2], [5, 6])["c1_s_per_token"] == 0.0  # too few steps: the mean


def test_fit_step_time_r2_counts_the_offset_of_a_clamped_intercept():
    """A negative intercept is clamped to ~0: every prediction is then 10 ms off, which r2 must show."""
    from pipeline.queueing.theory import fit_step_time

    tokens = np.arange(20, 60)
    fit = fit_step_time(-0.01 + 0.001 * tokens, tokens)
    assert fit["c0_s"] == pytest.approx(1e-6)
    assert fit["r2"] < 0.5
