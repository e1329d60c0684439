"""Bad input to `pars generate` and `pars lengths`: a bad generate.models entry, an output path under a
file, a damaged generation-cache entry, a damaged generations table. Each is one line naming the
file, key or flag, found before any backend is made; a damaged cache entry is generated again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import backend_spec, one_line_error, run_cli

import pipeline.generate as generate
from pipeline.backends import REQUIRED, Sample
from pipeline.contracts import GENERATIONS, PROMPTS, write_table
from pipeline.errors import PARSError

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def _prompts(path: Path, n: int = 3) -> Path:
    df = pd.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(n)],
            "dataset": ["alpaca_eval"] * n,
            "prompt": [f"prompt {i}" for i in range(n)],
            "split": ["test"] * n,
            "source_id": [str(i) for i in range(n)],
        }
    )
    return write_table(df, path, PROMPTS)


@pytest.fixture
def gen_env(tmp_path, monkeypatch):
    """A params file (the default one, smollm2's model dir pointed at an existing dir), a prompts file,
    and no backend: making one fails the test, since every bad input must be refused before."""
    params = yaml.safe_load(PARAMS.read_text())
    model_dir = tmp_path / "smollm2"
    model_dir.mkdir()
    params["generate"]["models"]["smollm2"]["model"] = str(model_dir)

    def write(change=None) -> Path:
        data = json.loads(json.dumps(params))
        if change:
            change(data)
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))  # keys as given: an int key among names too
        monkeypatch.setenv("PARS_PARAMS", str(path))
        return path

    def no_backend(*args, **kwargs):
        raise AssertionError("a backend was made for bad input")

    monkeypatch.setattr(generate, "make_backend", no_backend)
    prompts = _prompts(tmp_path / "prompts.parquet")
    argv = ["generate", "--prompts", prompts, "--out-root", tmp_path / "out", "--metrics", tmp_path / "m"]
    return write, argv, params


def test_default_params_pass_the_checks(gen_env):
    _, _, params = gen_env
    production = yaml.safe_load((PARAMS.parent / "profiles" / "production.yaml").read_text())
    for model, spec in [*params["generate"]["models"].items(), *production["generate"]["models"].items()]:
        generate.check_spec(model, spec)


@pytest.mark.parametrize(
    "key, value",
    [
        ("max_prompts_per_dataset", -5),
        ("max_prompts_per_dataset", 0),
        ("max_prompts_per_dataset", "many"),
        ("k", -1),
        ("k", "four"),
        ("k", 2.5),
        ("temperature", -0.1),
        ("temperature", "hot"),
        ("temperature", float("nan")),
        ("top_p", 0),
        ("top_p", 2),
        ("max_tokens", 0),
        ("max_tokens", 4096),  # not below max_model_len (2048): no prompt would fit
        ("seed", -1),
        ("seed", "abc"),
        ("max_num_seqs", 0),
        ("max_model_len", 0),
        ("dtype", "float13"),
        ("datasets", "alpaca_eval"),
        ("datasets", []),
        ("model", "models/base/nosuch"),
        ("model", "/no/such/model"),
        ("backend", "gpu"),
        ("temprature", 0.1),  # a misspelt option would run with the default
        ("base_url", "http://localhost:8000/v1"),  # the openai backend's, not vllm's
        ("engine_args", "kv_cache_dtype=fp8"),  # passed to vLLM as keyword arguments
        ("engine_args", ["quantization"]),
        ("engine_args", None),
    ],
)
def test_a_bad_model_entry_is_one_line_before_any_backend(gen_env, capsys, key, value):
    write, argv, _ = gen_env

    def change(p):
        p["generate"]["models"]["smollm2"][key] = value

    path = write(change)
    rc, _, err = run_cli(capsys, *argv, "--model", "smollm2")
    line = one_line_error(rc, err, "generate", f"generate.models.smollm2.{key}")
    assert str(path) in line


@pytest.mark.parametrize(
    "model, key", [("smollm2", key) for key in REQUIRED["vllm"]] + [("api", key) for key in REQUIRED["openai"]]
)
def test_a_missing_setting_that_decides_the_answers_is_named_before_any_backend(gen_env, capsys, model, key):
    """The backends have no default for k, the sampling, the seed, the dtype or max_model_len: an entry
    that leaves one out is refused in one line naming the file and key, before any backend is made."""
    write, argv, _ = gen_env

    def change(p):
        p["generate"]["models"]["api"] = dict(API)
        p["generate"]["models"][model].pop(key)

    path = write(change)
    rc, _, err = run_cli(capsys, *argv, "--model", model)
    line = one_line_error(rc, err, "generate", f"{path}: generate.models.{model}.{key} is missing: ")
    backend = "vllm" if model == "smollm2" else "openai"
    assert f"the {backend} backend needs {', '.join(REQUIRED[backend])} in each model's entry" in line


def test_every_missing_setting_is_listed(gen_env, capsys):
    write, argv, _ = gen_env
    path = write(lambda p: [p["generate"]["models"]["smollm2"].pop(key) for key in ("seed", "dtype", "top_p")])
    rc, _, err = run_cli(capsys, *argv, "--model", "smollm2")
    line = one_line_error(rc, err, "generate", f"{path}: generate.models.smollm2.top_p is missing")
    assert line.endswith("; also missing: seed, dtype")


def test_a_missing_dir_under_a_local_dir_is_a_path_not_a_hub_id(gen_env, capsys, tmp_path, monkeypatch):
    write, argv, _ = gen_env
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # so `models/nosuch` names a path here, not the hub org `models`
    write(lambda p: p["generate"]["models"]["smollm2"].update(model="models/nosuch"))
    rc, _, err = run_cli(capsys, *argv, "--model", "smollm2")
    one_line_error(rc, err, "generate", "generate.models.smollm2.model models/nosuch: no such directory")


@pytest.mark.parametrize("value, named", [("minilm/l6/x", "'minilm/l6/x'"), (None, "None: name the tokenizer")])
def test_a_mistyped_recorded_tokenizer_names_its_key(gen_env, capsys, value, named):
    write, argv, _ = gen_env
    write(lambda p: p["generate"].update(recorded_tokenizer=value))
    rc, _, err = run_cli(capsys, *argv, "--model", "chatgpt")
    one_line_error(rc, err, "generate", f"generate.recorded_tokenizer {named}")


def test_a_missing_backend_is_named(gen_env, capsys):
    write, argv, _ = gen_env
    write(lambda p: p["generate"]["models"]["smollm2"].pop("backend"))
    rc, _, err = run_cli(capsys, *argv, "--model", "smollm2")
    one_line_error(rc, err, "generate", "generate.models.smollm2.backend is missing")


@pytest.mark.parametrize(
    "change, model, name",
    [
        (lambda p: p["generate"].update(models=["smollm2"]), "smollm2", "generate.models"),
        (lambda p: p["generate"]["models"].update(smollm2="vllm"), "smollm2", "generate.models.smollm2"),
        (None, "nosuch", "'nosuch' is not in generate.models"),
    ],
)
def test_models_must_be_a_mapping_holding_the_model(gen_env, capsys, change, model, name):
    write, argv, _ = gen_env
    write(change)
    rc, _, err = run_cli(capsys, *argv, "--model", model)
    one_line_error(rc, err, "generate", name)


@pytest.mark.parametrize("flag", ["--out-root", "--metrics"])
def test_an_output_under_a_file_is_refused_before_any_backend(gen_env, capsys, tmp_path, flag):
    write, argv, _ = gen_env
    write()
    blocker = tmp_path / "blocker"
    blocker.write_text("keep me")
    argv = list(argv)
    argv[argv.index(flag) + 1] = blocker
    rc, _, err = run_cli(capsys, *argv, "--model", "smollm2")
    one_line_error(rc, err, "generate", str(blocker))
    assert blocker.read_text() == "keep me"


# an entry for FakeBackend (make_backend is patched): check_spec reads it as the openai backend's
FAKE_SPEC = {
    "backend": "openai",
    **backend_spec("openai", model="m", base_url="http://localhost:1/v1"),
    "datasets": ["alpaca_eval"],
}
# an openai entry with every key the backend requires
API = {"backend": "openai", **backend_spec("openai", model="m", base_url="http://localhost:8000/v1")}


class FakeBackend:
    """Answers prompt i with i + 1 tokens; records what it was asked for."""

    def __init__(self):
        self.asked: list[str] = []

    def identity(self):
        return {"backend": "fake"}

    describe = identity

    def cache_text(self, row):
        return row.prompt

    def start(self):
        pass

    def close(self):
        pass

    def generate(self, items):
        for item in items:
            self.asked.append(item.prompt_id)
            n = int(item.prompt_id[1:]) + 1
            yield item.prompt_id, [Sample(n, 0, "stop", 3, "x" * n, "")]


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: e.update(samples=[{"foo": 1}]),
        lambda e: e["samples"][0].update(output_tokens=-50),
        lambda e: e["samples"][0].update(output_tokens="many"),
        lambda e: e["samples"][0].update(output_tokens=True),
        lambda e: e["samples"][0].update(finish_reason="banana"),
        lambda e: e["samples"][0].pop("text"),
        lambda e: e.update(samples=[]),
        lambda e: e.update(samples=["one"]),
        lambda e: e.pop("prompt_id"),
        lambda e: e["samples"][0].update(prompt_tokens=-1),  # a prompt has >= 0 tokens
    ],
)
def test_a_damaged_cache_entry_is_generated_again_not_written(tmp_path, monkeypatch, capsys, damage):
    backend = FakeBackend()
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: backend)
    prompts = pd.read_parquet(_prompts(tmp_path / "prompts.parquet", n=4))
    spec = {**FAKE_SPEC, "max_prompts_per_dataset": None}
    out = tmp_path / "gen"
    generate.run("fake", spec, prompts, out)
    assert backend.asked == ["p0", "p1", "p2", "p3"]

    cache = out / "cache.jsonl"
    lines = cache.read_text().splitlines()
    entry = json.loads(lines[1])  # p1's
    damage(entry)
    lines[1] = json.dumps(entry)
    cache.write_text("\n".join(lines) + "\n")
    backend.asked.clear()
    capsys.readouterr()
    generate.run("fake", spec, prompts, out)

    assert backend.asked == ["p1"]  # resumed: only the damaged entry's prompt is generated again
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(cache) in warnings[0] and "skipped 1 damaged line(s) (line 2)" in warnings[0]
    gens = pd.read_parquet(out / "generations.parquet")
    assert gens.sort_values("prompt_id")["output_tokens"].tolist() == [1, 2, 3, 4]
    assert set(gens["finish_reason"]) == {"stop"} and gens.notna().all().all()


@pytest.mark.parametrize(
    "repairable",
    [
        # a count past the output's (the trace is part of output_tokens): bounded by it
        lambda e: e["samples"][0].update(reasoning_tokens=5),
        # a lone surrogate (JSON "\\ud800") loads, but no table can hold it: every later run failed
        lambda e: e["samples"][0].update(text="a\ud800"),
        lambda e: e["samples"][0].update(reasoning="\udfff"),
    ],
)
def test_a_repairable_cache_entry_is_repaired_not_asked_again(tmp_path, monkeypatch, capsys, repairable):
    """Lines an older run cached before the cache repaired them: repaired as they load, as add() does,
    so an openai run is not paid for twice."""
    backend = FakeBackend()
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: backend)
    prompts = pd.read_parquet(_prompts(tmp_path / "prompts.parquet", n=2))
    out = tmp_path / "gen"
    generate.run("fake", FAKE_SPEC, prompts, out)
    cache = out / "cache.jsonl"
    lines = cache.read_text().splitlines()
    entry = json.loads(lines[1])
    repairable(entry)
    lines[1] = json.dumps(entry)
    cache.write_text("\n".join(lines) + "\n")
    backend.asked.clear()
    generate.run("fake", FAKE_SPEC, prompts, out)
    assert backend.asked == [] and not (out / "cache.jsonl.damaged").exists()
    gens = pd.read_parquet(out / "generations.parquet")  # written: its text is valid UTF-8
    assert (gens["reasoning_tokens"] <= gens["output_tokens"]).all() and len(gens) == 2


class SurrogateBackend(FakeBackend):
    """Answers with lone surrogates and a surrogate pair split in two code points, and counts more
    reasoning tokens than output tokens (a trace tokenized again can)."""

    def generate(self, items):
        for item in items:
            yield item.prompt_id, [Sample(4, 6, "stop", 3, "a\ud800b", "\ud83d\ude00")]


def test_what_a_backend_returns_is_cached_as_the_load_check_accepts_it(tmp_path, monkeypatch):
    """Else the next run would set the line aside as damage and ask for the answer again, every run."""
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: SurrogateBackend())
    prompts = pd.read_parquet(_prompts(tmp_path / "prompts.parquet", n=2))
    out = tmp_path / "gen"
    generate.run("fake", FAKE_SPEC, prompts, out)
    gens = pd.read_parquet(out / "generations.parquet")
    assert gens["text"].tolist() == ["a\ufffdb"] * 2 and gens["reasoning"].tolist() == ["\U0001f600"] * 2
    assert gens["reasoning_tokens"].tolist() == [4, 4]  # bounded by the output's count
    meta = generate.run("fake", FAKE_SPEC, prompts, out)  # the cache lines are sound: nothing set aside
    assert meta["this_run"]["prompts_cached"] == 2 and not (out / "cache.jsonl.damaged").exists()


class FailingBackend(FakeBackend):
    """Answers the first prompt, then fails."""

    def generate(self, items):
        for i, pair in enumerate(super().generate(items)):
            if i == 1:
                raise RuntimeError("engine died")
            yield pair


def test_a_second_generate_on_one_cache_is_refused_and_loses_nothing(tmp_path, monkeypatch):
    """Run A holds the cache; run B must neither take A's half-written last line for damage and
    replace the file (A would go on appending to the deleted one) nor write A's outputs."""
    backend = FakeBackend()
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: backend)
    prompts = pd.read_parquet(_prompts(tmp_path / "prompts.parquet", n=3))
    out = tmp_path / "gen"
    first = generate.GenerationCache(out / "cache.jsonl")  # run A, mid-write
    first.add("k0", "p0", [Sample(1, 0, "stop", 3, "x", "")])
    first._fh.write('{"key": "k1", "prompt_id": "p1", "sam')
    first._fh.flush()
    before = (out / "cache.jsonl").read_bytes()
    with pytest.raises(PARSError, match=f"^another pars generate is writing {out / 'cache.jsonl'}"):
        generate.run("fake", FAKE_SPEC, prompts, out)
    assert (out / "cache.jsonl").read_bytes() == before and not (out / "cache.jsonl.damaged").exists()
    assert backend.asked == [] and not (out / "generations.parquet").exists()
    first.close()  # A ends: the lock is released
    # a run that fails releases it too, and the next resumes
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: FailingBackend())
    with pytest.raises(RuntimeError, match="engine died"):
        generate.run("fake", FAKE_SPEC, prompts, out)
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: backend)
    meta = generate.run("fake", FAKE_SPEC, prompts, out)
    assert meta["this_run"]["prompts_cached"] == 1 and backend.asked == ["p1", "p2"]


def test_leftover_temp_tables_are_removed_and_nothing_else(tmp_path, monkeypatch):
    """A killed run's write_table temp file would become part of the out DVC keeps (persist: true)."""
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: FakeBackend())
    prompts = pd.read_parquet(_prompts(tmp_path / "prompts.parquet", n=2))
    out = tmp_path / "gen"
    out.mkdir()
    leftover = out / ".generations.parquet.k3x_9a0q.tmp"
    leftover.write_bytes(b"PAR1 half")
    others = [out / ".meta.json.tmp", out / "cache.jsonl.tmp"]  # write_json's and the cache rewrite's
    for f in others:
        f.write_text("{half")
    kept = [out / "notes.tmp", out / ".generations.parquet.tmp", out / ".other.parquet.k3x_9a0q.tmp"]
    for f in kept:
        f.write_text("mine")
    generate.run("fake", FAKE_SPEC, prompts, out)
    assert not leftover.exists() and not any(f.exists() for f in others)
    assert all(f.read_text() == "mine" for f in kept)


@pytest.mark.parametrize(
    "name, named",
    [("../g2x", "generate.models.../g2x: the key '../g2x' must be a plain name"), (7, "generate.models.7: the key 7")],
)
def test_a_model_name_that_is_not_a_plain_name_is_refused(gen_env, capsys, tmp_path, name, named):
    """The key names <out-root>/<model>/ and <metrics>/<model>.json: `..` would write outside them."""
    write, argv, _ = gen_env
    path = write(lambda p: p["generate"]["models"].update({name: p["generate"]["models"]["smollm2"]}))
    rc, _, err = run_cli(capsys, *argv, "--model", str(name))
    assert str(path) in one_line_error(rc, err, "generate", named)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["params.yaml", "prompts.parquet", "smollm2"]


@pytest.mark.parametrize(
    "model, key, value",
    [
        ("smollm2", "repetition_penalty", "x"),
        ("smollm2", "repetition_penalty", 0),
        ("api", "concurrency", "abc"),
        ("api", "concurrency", 0),
        ("api", "max_retries", -1),
        ("api", "backoff_s", -1),
        ("api", "timeout_s", 0),
        ("api", "connect_timeout_s", float("inf")),
        ("api", "max_tokens_field", 5),
        ("api", "api_key_env", ""),
        ("api", "base_url", "localhost:8000"),
        ("api", "model", None),
    ],
)
def test_a_bad_backend_setting_names_file_and_key_before_any_backend(gen_env, capsys, model, key, value):
    write, argv, _ = gen_env

    def change(p):
        p["generate"]["models"]["api"] = dict(API)
        p["generate"]["models"][model][key] = value

    path = write(change)
    rc, _, err = run_cli(capsys, *argv, "--model", model)
    line = one_line_error(rc, err, "generate", f"generate.models.{model}.{key} ")
    assert str(path) in line and ": must be" in line


def _generations(root: Path, **columns) -> Path:
    """A generations.parquet for model `m` under root: two prompts, two samples each, with
    `columns` replacing columns as given (a pyarrow type is kept as stored, strings included)."""
    data = {
        "prompt_id": ["p0", "p0", "p1", "p1"],
        "sample": [0, 1, 0, 1],
        "output_tokens": [10, 12, 30, 34],
        "reasoning_tokens": [0, 0, 0, 0],
        "finish_reason": ["stop", "length", "stop", "stop"],
        "prompt_tokens": [5, 5, 6, 6],
        "text": ["a", "b", "c", "d"],
        "reasoning": ["", "", "", ""],
    }
    data.update(columns)
    path = root / "m" / "generations.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table(data), path)
    return path


@pytest.mark.parametrize(
    "columns, name",
    [
        ({"output_tokens": [10, -50, 30, 34]}, "negative output_tokens"),
        ({"output_tokens": [10, None, 30, 34]}, "no output_tokens"),
        ({"output_tokens": ["10", "12", "30", "34"]}, "'output_tokens' holds string, expected int32"),
        ({"output_tokens": [10.5, 12.0, 30.0, 34.0]}, "'output_tokens' holds double"),
        ({"finish_reason": ["stop", "banana", "stop", "stop"]}, "finish_reason must be one of"),
        ({"prompt_id": ["p0", None, "p1", "p1"]}, "no prompt_id"),
        ({"reasoning_tokens": [0, -1, 0, 0]}, "reasoning_tokens"),
        ({"sample": [0, 0, 0, 1]}, "duplicate"),
        ({"prompt_id": ["p0", "p0", "gone", "gone"]}, "1 prompt_id(s) are not in the prompts table (e.g. 'gone')"),
    ],
)
def test_lengths_refuses_damaged_generations_in_one_line(tmp_path, capsys, columns, name):
    path = _generations(tmp_path / "gens", **columns)
    prompts = _prompts(tmp_path / "prompts.parquet")
    metrics = tmp_path / "lengths.json"
    rc, _, err = run_cli(
        capsys,
        *("lengths", "--generations", tmp_path / "gens", "--prompts", prompts),
        *("--metrics", metrics, "--plot", tmp_path / "lengths.png"),
    )
    line = one_line_error(rc, err, "lengths", name)
    assert str(path) in line and not metrics.exists()


def test_lengths_of_sound_generations_still_works(tmp_path, capsys):
    _generations(tmp_path / "gens")
    prompts = _prompts(tmp_path / "prompts.parquet")
    rc, _, err = run_cli(
        capsys,
        *("lengths", "--generations", tmp_path / "gens", "--prompts", prompts),
        *("--metrics", tmp_path / "lengths.json", "--plot", tmp_path / "lengths.png"),
    )
    assert rc == 0, err
    table = json.loads((tmp_path / "lengths.json").read_text())
    assert table["m"]["all"]["mean_output_tokens"] == 21.5 and table["m"]["all"]["truncated_fraction"] == 0.25


def test_write_table_output_still_reads_back(tmp_path):
    """The type check accepts what write_table writes, and the narrower or null-only columns other
    writers produce (an int64 count, a column of nulls)."""
    from pipeline.contracts import read_table

    path = _generations(tmp_path, reasoning=pa.array([None] * 4, pa.null()))
    assert len(read_table(path, GENERATIONS)) == 4


def test_the_recorded_backend_refuses_selection_keys_it_would_ignore():
    """It answers every prompt of its source's datasets: a cap there would silently import them all."""
    from pipeline.errors import PARSError

    with pytest.raises(
        PARSError, match="generate.models.chatgpt.max_prompts_per_dataset: not an option of the recorded"
    ):
        generate.check_spec(
            "chatgpt", {"backend": "recorded", "source": "sharegpt:chatgpt", "max_prompts_per_dataset": 9}
        )


@pytest.mark.parametrize("value", ["reasoning_effort: high", ["a"], None, 3])
def test_extra_body_must_be_a_mapping(value):
    """An endpoint's extra_body is merged into each request: anything but a mapping, one line naming it."""
    from pipeline.errors import PARSError

    spec = {**API, "extra_body": value}
    with pytest.raises(PARSError, match=r"^generate\.models\.api\.extra_body .*: must be a mapping"):
        generate.check_spec("api", spec)
    generate.check_spec("api", {**spec, "extra_body": {"reasoning_effort": "high"}})


def test_pars_generate_reads_the_params_file_given(gen_env, capsys, tmp_path):
    """`--params other.yaml` is read, not $PARS_PARAMS: a bad value there is named with that file."""
    write, argv, _ = gen_env
    write()  # a sound $PARS_PARAMS
    other = tmp_path / "other.yaml"
    data = yaml.safe_load(PARAMS.read_text())
    data["generate"]["models"]["smollm2"]["k"] = 0
    other.write_text(yaml.safe_dump(data))
    rc, _, err = run_cli(capsys, *argv, "--params", other, "--model", "smollm2")
    line = one_line_error(rc, err, "generate", "generate.models.smollm2.k 0")
    assert str(other) in line


def test_openai_api_key_env_that_is_not_set_is_refused(monkeypatch):
    """`api_key_env` named on purpose but unset: one line naming the variable before any request
    (the endpoint would refuse each one); unnamed, OPENAI_API_KEY or a placeholder for local servers."""
    from pipeline.backends.openai_backend import OpenAIBackend

    spec = {**API, "k": 1}
    monkeypatch.delenv("PARS_TEST_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="`api_key_env` names PARS_TEST_KEY, which is not set"):
        OpenAIBackend({**spec, "api_key_env": "PARS_TEST_KEY"})
    assert OpenAIBackend(spec).api_key == "EMPTY"
    monkeypatch.setenv("PARS_TEST_KEY", "sk-test")
    assert OpenAIBackend({**spec, "api_key_env": "PARS_TEST_KEY"}).api_key == "sk-test"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    assert OpenAIBackend(spec).api_key == "sk-default"
