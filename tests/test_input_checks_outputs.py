"""score, report, export and the scheduler config: an output never replaces an input, a damaged
number is refused (never exported or rendered as another), and a damaged file is one line naming it,
checked before anything is written."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import one_line_error, run_cli

from pipeline.ranking.checkpoint import META

METRICS = Path(__file__).resolve().parents[1] / "metrics"


# ---------------------------------------------------------------- pars score


def test_score_output_that_is_the_input_is_refused(capsys, tmp_path, tiny_checkpoint):
    src = tmp_path / "same.jsonl"
    src.write_text('{"prompt": "hello"}\n')
    pq_src = tmp_path / "same.parquet"
    pq.write_table(pa.table({"prompt": ["hello"]}), pq_src)
    link = tmp_path / "link.jsonl"
    link.symlink_to(src)
    for inp, out in ((src, src), (pq_src, pq_src), (src, link), (src, tmp_path / "sub" / ".." / "same.jsonl")):
        before = inp.read_bytes()
        rc, _, err = run_cli(capsys, "score", "--checkpoint", tiny_checkpoint, inp, "-o", out)
        assert "is the input file" in one_line_error(rc, err, "score", f"-o {out}")
        assert inp.read_bytes() == before


def test_score_refuses_ids_that_are_not_finite(capsys, tmp_path, tiny_checkpoint):
    src = tmp_path / "in.jsonl"
    for blob, named in (
        ('{"id": 1, "prompt": "a"}\n{"id": NaN, "prompt": "b"}\n', f"{src}:2: id 'id' is nan"),
        ('{"prompt_id": 1e400, "prompt": "a"}\n', f"{src}:1: id 'prompt_id' is inf"),
    ):
        src.write_text(blob)
        rc, out, err = run_cli(capsys, "score", "--checkpoint", tiny_checkpoint, src)
        one_line_error(rc, err, "score", named)
        assert out == ""
    pq_src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1.0, float("nan")], "prompt": ["a", "b"]}), pq_src)
    rc, _, err = run_cli(capsys, "score", "--checkpoint", tiny_checkpoint, pq_src)
    one_line_error(rc, err, "score", f"{pq_src}: row 1: id 'id' is nan")
    pq.write_table(pa.table({"id": pa.array([1, None], pa.int64()), "prompt": ["a", "b"]}), pq_src)
    assert run_cli(capsys, "score", "--checkpoint", tiny_checkpoint, pq_src)[0] == 0  # a null id stays null


def test_score_refuses_a_checkpoint_with_non_finite_scores(capsys, tmp_path, tiny_ranker, tokenizer):
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint

    with torch.no_grad():
        tiny_ranker.head.bias.fill_(float("nan"))
    ckpt = save_checkpoint(tiny_ranker, tokenizer, tmp_path / "nan", method="pairwise", max_length=64, encoder="t")
    src, out = tmp_path / "in.jsonl", tmp_path / "scores.jsonl"
    src.write_text('{"prompt": "hello"}\n{"prompt": "write an essay"}\n')
    rc, stdout, err = run_cli(capsys, "score", "--checkpoint", ckpt, src, "-o", out)
    assert "non-finite scores for 2 of 2 prompts" in one_line_error(rc, err, "score", f"--checkpoint {ckpt}")
    assert not out.exists() and stdout == ""


def _lexical_checkpoint(path: Path, config, tokenizer) -> Path:
    from conftest import save_tiny_checkpoint

    from pipeline.export import record_file_hashes
    from pipeline.ranking.checkpoint import attach_lexical
    from pipeline.ranking.lexical import TfidfRidge

    ckpt = save_tiny_checkpoint(path, config, tokenizer)
    texts = ["write a long essay", "say hi", "an essay on rome", "hi there"] * 2
    fit = TfidfRidge.fit_grid(texts, [300, 5, 280, 6] * 2, alphas=[1.0], ngram_max=1, min_df=1)[0]
    attach_lexical(ckpt, fit, encoder_weight=1.0, lexical_weight=1.0)
    record_file_hashes(ckpt)
    return ckpt


def test_a_truncated_lexical_file_with_a_matching_hash_is_a_checkpoint_error(
    capsys, tmp_path, tiny_bert_config, tokenizer
):
    from pipeline.hashing import sha256_file
    from pipeline.ranking.checkpoint import CheckpointError
    from pipeline.ranking.lexical import WEIGHTS_FILE
    from pipeline.serving.scorer import Scorer

    ckpt = _lexical_checkpoint(tmp_path / "ckpt", tiny_bert_config, tokenizer)
    weights = ckpt / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:40])
    meta = json.loads((ckpt / META).read_text())  # hashes recomputed: the file itself must be refused
    meta["lexical"]["files_sha256"][WEIGHTS_FILE] = meta["files_sha256"][WEIGHTS_FILE] = sha256_file(weights)
    (ckpt / META).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=f"{WEIGHTS_FILE}: lexical weights could not be read"):
        Scorer.from_pretrained(ckpt)
    (src := tmp_path / "in.jsonl").write_text('{"prompt": "hello"}\n')
    rc, _, err = run_cli(capsys, "score", "--checkpoint", ckpt, src)
    one_line_error(rc, err, "score", str(weights))


@pytest.mark.parametrize("weight", [1e300, 1.7e308])  # inf as float32 only; inf already in float64
def test_a_lexical_weight_past_float32s_range_is_one_line_without_a_warning(
    capsys, tmp_path, tiny_bert_config, tokenizer, weight
):
    import warnings

    ckpt = _lexical_checkpoint(tmp_path / "ckpt", tiny_bert_config, tokenizer)
    meta = json.loads((ckpt / META).read_text())
    meta["lexical"]["lexical_weight"] = weight
    (ckpt / META).write_text(json.dumps(meta))
    (src := tmp_path / "in.jsonl").write_text('{"prompt": "hello"}\n{"prompt": "write an essay"}\n')
    with warnings.catch_warnings():
        # numpy's overflow warning would print before the error line
        warnings.filterwarnings("error", category=RuntimeWarning)
        rc, _, err = run_cli(capsys, "score", "--checkpoint", ckpt, src)
    assert "non-finite scores for 2 of 2 prompts" in one_line_error(rc, err, "score", f"--checkpoint {ckpt}")


# ---------------------------------------------------------------- pars report


@pytest.fixture
def report_dir(tmp_path, monkeypatch):
    """The committed ranking metrics in a scratch directory (the serving files copied as needed)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(METRICS / "ranking.json", tmp_path / "ranking.json")
    (tmp_path / "metrics").mkdir()
    return tmp_path


def test_report_out_that_is_an_input_is_refused(capsys, report_dir):
    shutil.copy(METRICS / "simulation.json", report_dir / "metrics/simulation.json")
    for args, named in (
        (("--ranking-only", "--ranking", "ranking.json", "--out", "ranking.json"), "is the --ranking file"),
        (("--ranking", "ranking.json", "--out", "./metrics/../ranking.json"), "is the --ranking file"),
        (("--ranking", "ranking.json", "--out", "metrics/simulation.json"), "is the input metrics/simulation.json"),
        (("--ranking", "ranking.json", "--out", "metrics/capacity.json"), "is the input metrics/capacity.json"),
    ):
        before = {p: p.read_bytes() for p in report_dir.rglob("*") if p.is_file()}
        rc, _, err = run_cli(capsys, "report", *args)
        assert named in one_line_error(rc, err, "report", "--out")
        assert {p: p.read_bytes() for p in report_dir.rglob("*") if p.is_file()} == before


def test_report_checks_its_inputs_before_making_any_directory(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(capsys, "report", "--ranking", "absent.json")
    one_line_error(rc, err, "report", "absent.json")
    rc, _, err = run_cli(capsys, "report", "--ranking", "absent.json", "--out", "a/b/page.md")
    one_line_error(rc, err, "report", "absent.json")
    assert list(tmp_path.iterdir()) == []  # no metrics/ (the default --out's) nor a/b/


def test_report_refuses_a_bool_number_and_a_zero_latency(capsys, report_dir):
    page = report_dir / "page.md"
    sim = json.loads((METRICS / "simulation.json").read_text())
    burst = sim["workloads"]["smollm2"]["scenarios"]["burst_2000"]
    burst["pars"]["speedup_mean_over_fcfs"] = True
    (report_dir / "metrics/simulation.json").write_text(json.dumps(sim))
    rc, _, err = run_cli(capsys, "report", "--ranking", "ranking.json", "--out", page)
    line = one_line_error(rc, err, "report", "metrics/simulation.json")
    assert "scenarios.burst_2000.pars.speedup_mean_over_fcfs True: must be a finite number >= 0" in line
    (report_dir / "metrics/simulation.json").unlink()
    bench = json.loads((METRICS / "engine_bench.json").read_text())
    for value in (0, -1.5, True):
        bench["pars"]["mean_per_token_latency"] = value
        (report_dir / "metrics/engine_bench.json").write_text(json.dumps(bench))
        rc, _, err = run_cli(capsys, "report", "--ranking", "ranking.json", "--out", page)
        line = one_line_error(rc, err, "report", "metrics/engine_bench.json")
        assert f"pars.mean_per_token_latency {value!r}: must be a finite number of seconds > 0" in line
    assert not page.exists()
    shutil.copy(METRICS / "engine_bench.json", report_dir / "metrics/engine_bench.json")
    assert run_cli(capsys, "report", "--ranking", "ranking.json", "--out", page)[0] == 0


@pytest.mark.parametrize(
    "name, edit, named",
    [
        ("engine_bench", lambda d: d["pars"].update(overhead_fraction=-1), "pars.overhead_fraction -1"),
        ("engine_bench", lambda d: d["pars"].pop("overhead_fraction"), "pars.overhead_fraction: missing"),
        ("engine_bench", lambda d: d["oracle"].update(scoring_fraction=1.5), "oracle.scoring_fraction 1.5"),
        ("scheduler_overhead", lambda d: d.update(max_pars_s_per_schedule="0.01"), "max_pars_s_per_schedule '0.01'"),
        ("scheduler_overhead", lambda d: d["modes"]["inline"].update(mean_pars_s_per_schedule=-0.5), "inline.mean"),
        ("capacity", lambda d: d.clear(), "setting.M: missing"),
        ("capacity", lambda d: d["workloads"]["1:1"].update(mu_measured=math.inf), "workloads.1:1.mu_measured inf"),
    ],
)
def test_report_refuses_a_damaged_share_time_or_capacity_naming_file_and_key(capsys, report_dir, name, edit, named):
    """A share of -100 % listed as a target met, `M = None`, or a failure naming no file: each one line."""
    data = json.loads((METRICS / f"{name}.json").read_text())
    edit(data)
    (report_dir / f"metrics/{name}.json").write_text(json.dumps(data))
    rc, _, err = run_cli(capsys, "report", "--ranking", "ranking.json", "--out", "page.md")
    assert named in one_line_error(rc, err, "report", f"metrics/{name}.json")
    assert not (report_dir / "page.md").exists()
    shutil.copy(METRICS / f"{name}.json", report_dir / f"metrics/{name}.json")
    assert run_cli(capsys, "report", "--ranking", "ranking.json", "--out", "page.md")[0] == 0


def test_report_refuses_a_tau_b_outside_its_range(capsys, report_dir):
    """A damaged ranking file would print `| chatgpt | 7.500 |`: refused naming the key."""
    ranking = json.loads((report_dir / "ranking.json").read_text())
    ranking["predictors"]["chatgpt"]["pairwise"]["chatgpt"]["overall"]["ci_high"] = 7.5
    (report_dir / "ranking.json").write_text(json.dumps(ranking))
    rc, _, err = run_cli(capsys, "report", "--ranking-only", "--ranking", "ranking.json", "--out", "page.md")
    line = one_line_error(rc, err, "report", "ranking.json")
    assert "predictors.chatgpt.pairwise.chatgpt.overall.ci_high 7.5 is not a tau_b" in line
    assert not (report_dir / "page.md").exists()


# ---------------------------------------------------------------- pars export


def _ranking(predictor: str = "both", **taus) -> dict:
    """A ranking.json with `predictor`/pairwise evaluated on each of `taus`'s models (a value of ...
    leaves kendall_tau_b out)."""
    stat = {"ci_low": 0.3, "ci_high": 0.5, "n_prompts": 10, "pair_accuracy": 0.7}
    by_eval = {m: {"overall": {**stat, **({} if t is ... else {"kendall_tau_b": t})}} for m, t in taus.items()}
    return {"predictors": {predictor: {"pairwise": by_eval}}, "references": {m: {"overall": {}} for m in taus}}


def test_export_needs_every_members_tau_b_and_in_range():
    from pipeline.export import export_metrics

    assert export_metrics(_ranking(a=0.388, b=0.371), "both", "pairwise", ["a", "b"], "rk.json")[1] == 0.371
    for taus, named in (
        ({"a": 0.388, "b": ...}, "rk.json has no predictors.both.pairwise.b.overall.kendall_tau_b"),
        ({"a": 0.388, "b": None}, "rk.json: predictors.both.pairwise.b.overall.kendall_tau_b is None"),
        ({"a": float("nan"), "b": 0.371}, "rk.json: predictors.both.pairwise.a.overall.kendall_tau_b is nan"),
        ({"a": 0.388, "b": -7.5}, "rk.json: predictors.both.pairwise.b.overall.kendall_tau_b -7.5 is not a tau_b"),
        ({"a": 10**400, "b": 0.3}, "predictors.both.pairwise.a.overall.kendall_tau_b 1000"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            export_metrics(_ranking(**taus), "both", "pairwise", ["a", "b"], "rk.json")
    # one model's own predictor: out of range refused; NaN (undefined) still exported as null
    with pytest.raises(ValueError, match="a.pairwise.a.overall.kendall_tau_b -7.5 is not a tau_b"):
        export_metrics(_ranking("a", a=-7.5), "a", "pairwise", ["a"], "rk.json")
    assert math.isnan(export_metrics(_ranking("a", a=float("nan")), "a", "pairwise", ["a"], "rk.json")[1])


def test_export_names_the_params_key_of_a_missing_predictor(tmp_path):
    from pipeline.export import run
    from pipeline.ranking.checkpoint import CheckpointError

    (tmp_path / "models/recorded/pairwise").mkdir(parents=True)
    (tmp_path / "ranking.json").write_text("{}")
    for params, named in (
        ({"model": "recored", "method": "pairwise"}, "export.model 'recored': checkpoint directory"),
        ({"model": "recorded", "method": "pairwsie"}, "export.method 'pairwsie': checkpoint directory"),
    ):
        with pytest.raises(CheckpointError, match=named):
            run(
                {"name": "pars-x", **params},
                models_root=tmp_path / "models",
                ranking_path=tmp_path / "ranking.json",
                out_root=tmp_path / "export",
            )
    assert not (tmp_path / "export").exists()


# ---------------------------------------------------------------- the scheduler's config


def test_pars_config_refuses_odd_keys_and_digits_of_other_scripts():
    from pipeline.serving.pars_config import PARSConfig, PARSConfigError

    bad = [
        ({1: 2, "x": 3}, {}, r"additional_config\['pars'\]: keys must be strings, got \[1\]"),
        ({"batch_size": "٣"}, {}, r"\['batch_size'\] must be an integer >= 1"),
        ({"batch_size": 4.0}, {}, r"\['batch_size'\] must be an integer >= 1"),
        (None, {"PARS_BATCH_SIZE": "٣"}, "PARS_BATCH_SIZE must be an integer >= 1"),
        (None, {"PARS_SCORER_THREADS": "1_0"}, "PARS_SCORER_THREADS must be an integer >= 0"),
        (None, {"PARS_STARVATION_S": "١٢"}, "PARS_STARVATION_S must be a number"),
    ]
    for section, env, match in bad:
        with pytest.raises(PARSConfigError, match=match) as info:
            PARSConfig.from_sources(section, env=env)
        assert "\n" not in str(info.value)
    env = {"PARS_BATCH_SIZE": " 7", "PARS_STARVATION_S": "Infinity", "PARS_FAULT_LOG_INTERVAL_S": "1.5e1"}
    config = PARSConfig.from_sources({"scorer_threads": "2"}, env=env)
    assert (config.batch_size, config.scorer_threads, config.fault_log_interval_s) == (7, 2, 15.0)
    assert config.starvation_s == float("inf")
