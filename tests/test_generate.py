"""generate: the resume cache, prompt selection, the recorded backend, reasoning splitting,
and the openai backend's retry rules against a real HTTP server on loopback."""

from __future__ import annotations

import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
from helpers import backend_spec

from pipeline.backends import OPTIONS, REQUIRED, PromptItem, Sample, split_reasoning
from pipeline.backends.openai_backend import EndpointError, OpenAIBackend, estimated_reasoning_tokens
from pipeline.errors import PARSError
from pipeline.generate import GenerationCache, cache_key, run, select_prompts
from pipeline.sources import SOURCES


def _sample(n: int, reason: str = "stop") -> Sample:
    return Sample(
        output_tokens=n, reasoning_tokens=0, finish_reason=reason, prompt_tokens=5, text="x" * n, reasoning=""
    )


def test_split_reasoning():
    assert split_reasoning("<think>step 1\nstep 2</think>\nThe answer is 4.") == ("step 1\nstep 2", "The answer is 4.")
    assert split_reasoning("plan first</think>done", opened=True) == ("plan first", "done")  # template opened <think>
    assert split_reasoning("no trace here") == ("", "no trace here")
    # a trace cut at max_tokens before </think> is all reasoning, not an answer without a trace
    assert split_reasoning("<think>step 1\nstep 2, and then") == ("step 1\nstep 2, and then", "")
    assert split_reasoning("step 1, and then", opened=True) == ("step 1, and then", "")
    assert split_reasoning("plan</think>done", opened=True) == ("plan", "done")
    assert split_reasoning("<think>plan</think>done", opened=True) == ("plan", "done")


def test_a_closing_tag_alone_is_a_trace_only_when_the_template_opened_it():
    """An answer that merely mentions </think> (HTML, a how-to about R1) keeps its text: without
    `opened`, a trace needs the leading <think>."""
    text = "Models end a trace with </think> and then answer."
    assert split_reasoning(text) == ("", text)
    assert split_reasoning(text, opened=True) == ("Models end a trace with", "and then answer.")


def test_cache_survives_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = GenerationCache(path)
    cache.add("k1", "p1", [_sample(3), _sample(4)])
    cache.add("k2", "p2", [_sample(5), _sample(6)])
    assert len(path.read_text().splitlines()) == 2  # each entry is on file once added, before close
    cache.close()  # the process ends
    with path.open("a") as fh:  # what a kill in the middle of a write leaves behind
        fh.write('{"key": "k3", "prompt_id": "p3", "samples": [{"output_tok')
    reopened = GenerationCache(path)
    assert set(reopened.entries) == {"k1", "k2"}
    reopened.add("k3", "p3", [_sample(7), _sample(8)])
    reopened.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)  # no torn line, no duplicate


def test_cache_keeps_every_valid_line_around_a_damaged_one(tmp_path, capsys):
    """A damaged line in the middle (not just a torn tail) costs that line only: the valid lines
    after it are kept, the damage is reported and its bytes set aside."""
    path = tmp_path / "cache.jsonl"
    cache = GenerationCache(path)
    for i in range(6):
        cache.add(f"k{i}", f"p{i}", [_sample(i + 1)])
    cache.close()
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"key": "k2", "prompt_id": "p2", "sam\x00ples": [}\n'  # corrupted in place
    lines.insert(4, b"[1, 2, 3]\n")  # valid JSON, not an entry
    path.write_bytes(b"".join(lines))
    reopened = GenerationCache(path)
    assert set(reopened.entries) == {"k0", "k1", "k3", "k4", "k5"}
    assert "skipped 2 damaged line(s) (line 3, 5)" in capsys.readouterr().out
    assert len(path.read_text().splitlines()) == 5  # the file now holds only valid entries
    assert len((tmp_path / "cache.jsonl.damaged").read_bytes().splitlines()) == 2
    reopened.close()  # one open cache at a time: it is locked while open
    assert set(GenerationCache(path).entries) == set(reopened.entries)  # and reopens cleanly


def test_cache_key_changes_with_sampling_settings():
    ident = {"model": "m", "temperature": 0.7, "k": 4}
    assert cache_key(ident, "p") == cache_key(dict(ident), "p")
    assert cache_key(ident, "p") != cache_key({**ident, "temperature": 1.0}, "p")
    assert cache_key(ident, "p") != cache_key(ident, "q")


def _prompts(n_per: dict[str, int]) -> pd.DataFrame:
    rows = [(f"{d[:2]}{i:04d}", d, f"{d} prompt {i}", "train", str(i)) for d, n in n_per.items() for i in range(n)]
    return pd.DataFrame(rows, columns=["prompt_id", "dataset", "prompt", "split", "source_id"])


def test_select_prompts_by_dataset_and_cap():
    prompts = _prompts({"aa": 10, "bb": 10, "cc": 3})
    sel = select_prompts(prompts, {"datasets": ["aa", "cc"], "max_prompts_per_dataset": 4})
    assert sel.groupby("dataset").size().to_dict() == {"aa": 4, "cc": 3}
    with pytest.raises(ValueError, match="not in the prompts file"):
        select_prompts(prompts, {"datasets": ["zz"]})


def test_recorded_backend_imports_answers(tmp_path):
    from pipeline.prepare import load_source

    prompts, _ = load_source("alpaca_eval", {"cap": 12}, {"train": 1.0}, 16000)
    meta = run(
        "gpt-4-turbo",
        {"backend": "recorded", "source": "alpaca_eval:gpt-4-1106-preview"},
        prompts,
        tmp_path / "gpt-4-turbo",
        recorded_tokenizer="minilm-l6",
    )
    gens = pd.read_parquet(tmp_path / "gpt-4-turbo" / "generations.parquet")
    assert len(gens) == 12 and set(gens["sample"]) == {0} and set(gens["finish_reason"]) == {"stop"}
    assert (gens["output_tokens"] > 0).all() and (gens["prompt_tokens"] > 0).all()
    # counted with the documented tokenizer: a 4-word answer is a handful of tokens, not characters
    assert gens["output_tokens"].median() < gens["text"].str.len().median()
    assert meta["tokenizer"] == "minilm-l6" and meta["samples"] == 12
    # a second run has nothing to do and rewrites the same outputs, byte for byte (DVC hashes them:
    # a run's time or counts inside them would re-run every stage downstream); those go to the run's stats
    out = tmp_path / "gpt-4-turbo"
    first = {f.name: f.read_bytes() for f in sorted(out.iterdir())}
    meta2 = run(
        "gpt-4-turbo",
        {"backend": "recorded", "source": "alpaca_eval:gpt-4-1106-preview"},
        prompts,
        out,
        recorded_tokenizer="minilm-l6",
        run_stats_path=tmp_path / "stats.json",
    )
    assert meta2["this_run"]["prompts_generated"] == 0
    assert {f.name: f.read_bytes() for f in sorted(out.iterdir())} == first
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["prompts_generated"] == 0 and stats["prompts_cached"] == 12 and stats["output_tokens"] == 0
    assert meta["this_run"]["prompts_generated"] == 12 and meta["this_run"]["output_tokens"] > 0


def test_cached_entry_with_another_sample_count_than_k_is_generated_again(tmp_path, capsys):
    """A cache line under the right key but holding other than k samples (hand-edited, or written by
    another tool) is not taken as the answers: that prompt is generated again, and the run says so."""
    from pipeline.prepare import load_source

    prompts, _ = load_source("alpaca_eval", {"cap": 3}, {"train": 1.0}, 16000)
    spec = {"backend": "recorded", "source": "alpaca_eval:gpt-4-1106-preview"}
    out = tmp_path / "gpt-4-turbo"
    run("gpt-4-turbo", spec, prompts, out, recorded_tokenizer="minilm-l6")
    first = (out / "generations.parquet").read_bytes()
    lines = (out / "cache.jsonl").read_text().splitlines()
    entry = json.loads(lines[1])
    entry["samples"] = entry["samples"] * 2  # k is 1 for recorded answers
    lines[1] = json.dumps(entry)
    (out / "cache.jsonl").write_text("\n".join(lines) + "\n")
    meta = run("gpt-4-turbo", spec, prompts, out, recorded_tokenizer="minilm-l6")
    assert meta["this_run"]["prompts_generated"] == 1 and meta["this_run"]["prompts_cached"] == 2
    assert f"1 cached entry in {out / 'cache.jsonl'} with a number of samples other than k=1" in capsys.readouterr().out
    assert (out / "generations.parquet").read_bytes() == first


def test_engine_args_and_extra_body_key_the_cache_only_when_set(monkeypatch):
    """vLLM engine_args and an endpoint's extra_body can change the answers: set, they are in the
    cache key; unset, the key is the one caches made before them hold."""
    import pipeline.backends.vllm_backend as vb
    from pipeline.backends.openai_backend import OpenAIBackend

    monkeypatch.setattr(vb, "_on_cpu", lambda: True)
    base = backend_spec("vllm", model="m", k=4, max_tokens=256)
    plain = vb.VllmBackend(base).identity()
    assert "engine_args" not in plain and vb.VllmBackend({**base, "engine_args": {}}).identity() == plain
    quantized = vb.VllmBackend({**base, "engine_args": {"kv_cache_dtype": "fp8"}}).identity()
    assert cache_key(quantized, "p") != cache_key(plain, "p")
    endpoint = backend_spec("openai", model="m", base_url="http://localhost:8000/v1", k=2)
    plain = OpenAIBackend(endpoint).identity()
    assert "extra_body" not in plain
    effort = OpenAIBackend({**endpoint, "extra_body": {"reasoning_effort": "high"}}).identity()
    assert effort["extra_body"] == {"reasoning_effort": "high"} and cache_key(effort, "p") != cache_key(plain, "p")


def test_recorded_backend_reads_one_models_answers_from_several_datasets(tmp_path, monkeypatch):
    from pipeline.sources.base import RawRecord, Source

    class Firsts(Source):
        name, answer_models = "firsts", ("m",)

        def records(self):
            yield from (RawRecord(f"c{i}", f"first question {i}", {"m": "short " * (i + 1)}) for i in range(4))
            # an id that repeats with another prompt and reply (ShareGPT has 123): it must not
            # replace c1's answer
            yield RawRecord("c1", "a different conversation", {"m": "word " * 7})
            yield RawRecord("c9", "write an essay", {"m": "\u200b \n"})  # a failed reply: no answer

    class Later(Source):
        name, answer_models = "later", ("m",)

        def records(self):
            yield RawRecord("c0", "and then?", {"m": "word " * 40})  # an id "firsts" has too
            yield RawRecord("c1:2", "no answer recorded")

    sources = {"firsts": Firsts, "later": Later}
    for name, source in sources.items():  # get_source and generate's check of `source` read SOURCES
        monkeypatch.setitem(SOURCES, name, source)
    prompts = pd.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(7)],
            "dataset": ["firsts"] * 4 + ["later"] * 2 + ["firsts"],
            "prompt": [f"first question {i}" for i in range(4)] + ["and then?", "no answer recorded", "write an essay"],
            "split": "train",
            "source_id": ["c0", "c1", "c2", "c3", "c0", "c1:2", "c9"],
        }
    )
    meta = run(
        "m",
        {"backend": "recorded", "source": ["firsts:m", "later:m"]},
        prompts,
        tmp_path / "m",
        recorded_tokenizer="minilm-l6",
    )
    gens = pd.read_parquet(tmp_path / "m" / "generations.parquet").set_index("prompt_id")
    # answers are keyed by dataset, id and prompt: c0 is two prompts; a prompt without an answer is left out
    assert sorted(gens.index) == ["p0", "p1", "p2", "p3", "p4"]
    assert gens.loc["p4", "output_tokens"] == 40 and gens.loc["p0", "output_tokens"] == 1
    assert gens.loc["p1", "output_tokens"] == 2  # its own reply, not the later record's with the same id
    assert meta["samples"] == 5 and meta["source"] == ["firsts:m", "later:m"]
    # a blank reply is left out and listed, never a 0-token label; so is a prompt with no reply on file
    assert meta["skipped_prompts"] == 2 and "blank" in meta["skipped"]["p6"]
    assert "no recorded reply" in meta["skipped"]["p5"]


def test_recorded_backend_imports_a_changed_reply_again(tmp_path, monkeypatch):
    """The cache key holds a digest of the reply on file: a reply that changes is imported again
    (as a cold run would), not served from the old entry."""
    from pipeline.sources.base import RawRecord, Source

    reply = {"text": "word " * 3}

    class One(Source):
        name, answer_models = "one", ("m",)

        def records(self):
            yield RawRecord("c0", "a question", {"m": reply["text"]})

    monkeypatch.setitem(SOURCES, "one", One)
    prompts = pd.DataFrame(
        {"prompt_id": ["p0"], "dataset": ["one"], "prompt": ["a question"], "split": "train", "source_id": ["c0"]}
    )
    spec = {"backend": "recorded", "source": "one:m"}
    assert run("m", spec, prompts, tmp_path, recorded_tokenizer="minilm-l6")["this_run"]["prompts_generated"] == 1
    assert run("m", spec, prompts, tmp_path, recorded_tokenizer="minilm-l6")["this_run"]["prompts_generated"] == 0
    reply["text"] = "word " * 9
    assert run("m", spec, prompts, tmp_path, recorded_tokenizer="minilm-l6")["this_run"]["prompts_generated"] == 1
    assert pd.read_parquet(tmp_path / "generations.parquet")["output_tokens"].tolist() == [9]


def test_recorded_backend_that_skips_every_prompt_says_why(tmp_path, monkeypatch):
    """Prompts with no source_id, or texts from another version of the source: the recorded backend
    skips them all. The error gives the count and the first reason, not a `datasets` key it refuses."""
    from pipeline.sources.base import RawRecord, Source

    class One(Source):
        name, answer_models = "one", ("m",)

        def records(self):
            yield RawRecord("c0", "a question", {"m": "an answer"})

    monkeypatch.setitem(SOURCES, "one", One)
    prompts = pd.DataFrame(
        {
            "prompt_id": ["p0", "p1"],
            "dataset": ["one", "one"],
            "prompt": ["a question", "a question, reworded"],
            "split": "train",
            "source_id": [None, "c0"],
        }
    )
    with pytest.raises(PARSError) as err:
        run("m", {"backend": "recorded", "source": "one:m"}, prompts, tmp_path, recorded_tokenizer="minilm-l6")
    assert str(err.value) == (
        "generate.models.m: no prompts selected for model 'm': the recorded backend skipped 2 prompt(s), "
        "e.g. p0: no recorded reply of this model to this prompt"
    )
    assert not any(tmp_path.iterdir())  # refused before the cache or any output


def test_recorded_backend_names_a_bad_source():
    from pipeline.backends.recorded import RecordedBackend

    for bad in ("sharegpt", ["sharegpt:chatgpt", "sharegpt_turns"], []):
        with pytest.raises(ValueError, match="must be '<dataset>:<answer model>' or a list of them"):
            RecordedBackend({"source": bad})


@pytest.mark.parametrize(
    "source, named",
    [
        ("sharegpt", "generate.models.m.source 'sharegpt': must be '<dataset>:<answer model>'"),
        (["sharegpt:chatgpt", 5], "generate.models.m.source 5: must be"),
        ("sharegpt:gpt-4", "generate.models.m.source 'sharegpt:gpt-4': no source ships these answers (known: alpaca"),
        ("mine:chatgpt", "generate.models.m.source 'mine:chatgpt': no source ships"),
    ],
)
def test_generate_names_the_params_key_of_a_bad_recorded_source(tmp_path, source, named):
    prompts = pd.DataFrame(
        {"prompt_id": ["p0"], "dataset": ["mine"], "prompt": ["a question"], "split": "train", "source_id": ["c0"]}
    )
    with pytest.raises(PARSError, match=re.escape(named)):
        run("m", {"backend": "recorded", "source": source}, prompts, tmp_path, recorded_tokenizer="minilm-l6")
    # a known source whose dataset prepare did not load: the key, and where to add the dataset
    with pytest.raises(
        PARSError, match=r"generate.models.m.source: recorded backend: no prompts of dataset 'sharegpt'"
    ):
        run(
            "m",
            {"backend": "recorded", "source": "sharegpt:chatgpt"},
            prompts,
            tmp_path,
            recorded_tokenizer="minilm-l6",
        )


# ---- openai backend: retry rules, against a real HTTP server on loopback --------------------


class _Script:
    """Per-request status codes the server answers before it succeeds."""

    def __init__(self, statuses, refuse_word=None, counts_reasoning=True):
        self.statuses = list(statuses)
        self.refuse_word = refuse_word  # a prompt holding it is refused (400), as one over the context length
        self.counts_reasoning = counts_reasoning  # False: usage without completion_tokens_details, as vLLM's server
        self.calls = 0
        self.lock = threading.Lock()


def _serve(script: _Script):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.calls += 1
                status = script.statuses.pop(0) if script.statuses else 200
            message = b"scripted failure"
            if script.refuse_word and script.refuse_word in body["messages"][0]["content"]:
                status, message = 400, b"This model's maximum context length is 2048 tokens."
            if status != 200:
                self.send_response(status)
                self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(b'{"error": {"message": "' + message + b'"}}')
                return
            words = body["messages"][0]["content"].split()
            payload = {
                "choices": [
                    {
                        "message": {"content": f"<think>hmm</think>{' '.join(words)}"},
                        "finish_reason": "length" if len(words) >= body["max_tokens"] else "stop",
                    }
                ],
                "usage": {"prompt_tokens": len(words), "completion_tokens": len(words) + 1},
            }
            if script.counts_reasoning:
                payload["usage"]["completion_tokens_details"] = {"reasoning_tokens": 1}
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def endpoint():
    servers = []

    def start(statuses, refuse_word=None, counts_reasoning=True):
        script = _Script(statuses, refuse_word, counts_reasoning)
        server = _serve(script)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1", script

    yield start
    for server in servers:
        server.shutdown()


def _backend(url, **extra):
    return OpenAIBackend(
        backend_spec("openai", base_url=url, model="m", **{"k": 2, "max_tokens": 3, "backoff_s": 0.01, **extra})
    )


def test_openai_retries_429_and_5xx_then_succeeds(endpoint):
    url, script = endpoint([429, 503, 500])
    backend = _backend(url)
    items = [PromptItem("a", "one two"), PromptItem("b", "one two three four")]
    results = dict(backend.generate(items))
    assert set(results) == {"a", "b"} and all(len(s) == 2 for s in results.values())
    a, b = results["a"][0], results["b"][0]
    assert (a.output_tokens, a.reasoning_tokens, a.finish_reason, a.text, a.reasoning) == (
        3,
        1,
        "stop",
        "one two",
        "hmm",
    )
    assert b.finish_reason == "length"
    assert backend.retries == 3 and script.calls == 4 + 3


def test_openai_uncounted_traces_are_estimated_and_counted_in_meta(endpoint):
    url, _ = endpoint([], counts_reasoning=False)
    backend = _backend(url)
    results = dict(backend.generate([PromptItem("a", "one two"), PromptItem("b", "one two three four")]))
    a = results["a"][0]
    assert (a.output_tokens, a.reasoning, a.text) == (3, "hmm", "one two")
    assert a.reasoning_tokens == round(3 * len("hmm") / len("hmmone two")) == 1
    assert backend.describe()["reasoning_tokens_estimated_this_run"] == 4  # 2 prompts x k = 2


@pytest.mark.parametrize("status", [401, 404, 400, 422])
def test_openai_client_error_stops_with_the_message(endpoint, status):
    """A 4xx that is not about this prompt (a bad key, model name or request field: 400/422 without
    a context-length or content-filter message) would fail every prompt alike: it stops the run."""
    url, _ = endpoint([status])
    with pytest.raises(EndpointError, match=f"refused the request.*{status}.*scripted failure"):
        list(_backend(url, concurrency=1).generate([PromptItem("a", "hi")]))


def test_openai_refused_prompt_is_skipped_and_the_run_goes_on(endpoint, tmp_path):
    """A 400 saying a prompt is over the context length skips that prompt, listed with the endpoint's
    message; the others are answered. A run whose every prompt is refused stops with one line naming
    a refusal."""
    url, _ = endpoint([], refuse_word="huge")
    backend = _backend(url)
    items = [PromptItem("a", "one two"), PromptItem("b", "a huge pasted text"), PromptItem("c", "three")]
    results = dict(backend.generate(items))
    assert set(results) == {"a", "c"}
    assert list(backend.skipped) == ["b"] and "HTTP 400" in backend.skipped["b"]
    assert "maximum context length" in backend.skipped["b"]

    prompts = pd.DataFrame(
        {"prompt_id": ["b"], "dataset": ["d"], "source_id": ["0"], "prompt": ["a huge pasted text"], "split": ["test"]}
    )
    with pytest.raises(ValueError, match="no answers were produced; 1 prompt\\(s\\) skipped, e.g. b: refused"):
        run(
            "m",
            {"backend": "openai", **backend_spec("openai", base_url=url, model="m", k=1, backoff_s=0.01)},
            prompts,
            tmp_path / "m",
        )


def test_openai_gives_up_after_max_retries(endpoint):
    url, script = endpoint([503] * 10)
    with pytest.raises(EndpointError, match="still failing after 2 retries"):
        list(_backend(url, max_retries=2, k=1).generate([PromptItem("a", "hi")]))
    assert script.calls == 3


def test_openai_unreachable_endpoint_is_named():
    backend = _backend("http://127.0.0.1:9/v1", max_retries=1, k=1, timeout_s=2)
    with pytest.raises(EndpointError, match="127.0.0.1:9.*ConnectError"):
        list(backend.generate([PromptItem("a", "hi")]))


def test_openai_hanging_endpoint_fails_fast_and_names_the_url():
    import socket
    import time

    # listens (the connect succeeds) but never answers: a hung server
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    try:
        t0 = time.monotonic()
        with pytest.raises(EndpointError, match=f"{url} is unreachable.*ReadTimeout"):
            list(_backend(url, k=1, connect_timeout_s=0.2).generate([PromptItem("a", "hi")]))
        assert time.monotonic() - t0 < 5
    finally:
        sock.close()
    # the defaults: an endpoint that never answers fails in about a minute, not 15
    b = OpenAIBackend(backend_spec("openai", base_url=url, model="m"))
    probe_s = 3 * b.connect_timeout + b.backoff * (1 + 2)
    assert probe_s <= 60 and 2 * b.timeout <= 150


def test_openai_request_that_times_out_twice_stops_the_run(endpoint, monkeypatch):
    import httpx

    url, _ = endpoint([])  # answers the probe; every chat request then times out

    async def timed_out(*args, **kwargs):
        raise httpx.ReadTimeout("timed out")

    monkeypatch.setattr(httpx.AsyncClient, "post", timed_out)
    backend = _backend(url, k=1, timeout_s=0.2)
    with pytest.raises(EndpointError, match="did not answer in 0.2 s, twice in a row"):
        list(backend.generate([PromptItem("a", "hi")]))
    assert backend.retries == 1  # one retry, not max_retries (6) of timeout_s each


def test_openai_bad_spec_and_non_openai_answers_are_one_line_errors():
    with pytest.raises(ValueError, match="timeout_s"):
        OpenAIBackend(backend_spec("openai", base_url="http://x/v1", model="m", timeout_s=0))
    with pytest.raises(EndpointError, match="response without usable choices"):
        OpenAIBackend._parse({"choices": [{"message": "not a dict"}], "usage": {}}, "http://x/v1")


def test_pars_generate_with_an_unreachable_endpoint_ends_in_one_line(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main as pars
    from pipeline.contracts import PROMPTS, write_table

    prompts = tmp_path / "prompts.parquet"
    write_table(
        pd.DataFrame({"prompt_id": ["a"], "dataset": ["d"], "prompt": ["hi"], "split": ["test"], "source_id": ["1"]}),
        prompts,
        PROMPTS,
    )
    params = tmp_path / "params.yaml"
    params.write_text(
        "generate:\n  models:\n    gpt:\n      backend: openai\n      base_url: http://127.0.0.1:9/v1\n"
        "      model: m\n      connect_timeout_s: 0.2\n      backoff_s: 0.01\n"
        "      k: 1\n      temperature: 0.7\n      top_p: 0.95\n      max_tokens: 16\n"
    )
    monkeypatch.setenv("PARS_PARAMS", str(params))
    assert pars(["generate", "--model", "gpt", "--prompts", str(prompts), "--out-root", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("pars generate: error: http://127.0.0.1:9/v1 is unreachable")


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"concurrency": "abc"}, "concurrency"),
        ({"k": 2.5}, "k"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": None}, "max_tokens"),
    ],
)
def test_openai_spec_numbers_are_named(bad, key):
    from pipeline.backends.openai_backend import OpenAIBackend

    with pytest.raises(ValueError, match=f"`{key}` must be"):
        OpenAIBackend(backend_spec("openai", base_url="http://localhost:1", model="m", **bad))


def test_vllm_cache_key_follows_a_local_model_directory_s_content(tmp_path, monkeypatch):
    """New weights at the same path are other answers: a local model directory keys the cache by
    its files' content (names and bytes), a hub id by its name."""
    import pipeline.backends.vllm_backend as vb

    monkeypatch.setattr(vb, "_on_cpu", lambda: True)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"weights-1")
    spec = backend_spec("vllm", model=str(model), k=4, max_tokens=256)
    first = vb.VllmBackend(spec).identity()
    assert len(first["model_digest"]) == 64
    assert vb.VllmBackend(spec).identity() == first  # the same files: the same key
    (model / ".cache").mkdir()
    (model / ".cache" / "lock").write_text("x")  # hidden files are not the model
    assert vb.VllmBackend(spec).identity() == first
    (model / "model.safetensors").write_bytes(b"weights-2")  # same size, other bytes
    assert cache_key(vb.VllmBackend(spec).identity(), "p") != cache_key(first, "p")
    (model / "model.safetensors").write_bytes(b"weights-1")
    (model / "tokenizer.json").write_text("{}")  # a file more
    assert vb.VllmBackend(spec).identity() != first
    assert "model_digest" not in vb.VllmBackend({**spec, "model": "org/hub-model"}).identity()
    gguf = tmp_path / "model.gguf"  # a single-file model: its bytes
    gguf.write_bytes(b"gguf-1")
    one = vb.VllmBackend({**spec, "model": str(gguf)}).identity()["model_digest"]
    gguf.write_bytes(b"gguf-2")
    assert vb.VllmBackend({**spec, "model": str(gguf)}).identity()["model_digest"] != one


def test_vllm_identity_adds_repetition_penalty_only_when_set():
    from pipeline.backends.vllm_backend import VllmBackend

    base = backend_spec("vllm", model="m", k=4, max_tokens=256)
    plain = VllmBackend(base).identity()
    assert "repetition_penalty" not in plain  # caches written before the knob keep their keys
    assert VllmBackend({**base, "repetition_penalty": 1.0}).identity() == plain
    penalised = VllmBackend({**base, "repetition_penalty": 1.1}).identity()
    assert penalised["repetition_penalty"] == 1.1
    assert cache_key(penalised, "p") != cache_key(plain, "p")
    for bad in (0, float("nan"), "strong", True):
        with pytest.raises(ValueError, match="repetition_penalty must be a number > 0"):
            VllmBackend({**base, "repetition_penalty": bad}).identity()


def test_vllm_dtype_keys_the_cache_and_native_is_bf16_only_where_native(monkeypatch):
    """`dtype: native` is bfloat16 on a CPU with native bf16 and float32 on one without; a dtype named
    in the params or picked by `native` is part of the cache key (a float32 cache never answers for
    bfloat16), one key per dtype however spelt; float32 keeps the key of caches made before the
    knob; `auto` has its own key, since vLLM may cast a float32 model to bfloat16. No dtype is no
    default: the entry must name one."""
    import pipeline.backends.vllm_backend as vb
    import pipeline.hardware as hardware

    monkeypatch.setattr(vb, "_on_cpu", lambda: True)
    base = backend_spec("vllm", model="m", k=4, max_tokens=256, without=("dtype",))
    float32 = cache_key(vb.VllmBackend({**base, "dtype": "float32"}).identity(), "p")
    assert cache_key(vb.VllmBackend({**base, "dtype": "float"}).identity(), "p") == float32
    keys = {
        dtype: cache_key(vb.VllmBackend({**base, "dtype": dtype}).identity(), "p")
        for dtype in ("bfloat16", "half", "auto")
    }
    assert len(set(keys.values()) | {float32}) == 4
    with pytest.raises(ValueError, match="params need `dtype`"):
        vb.VllmBackend(base)
    assert cache_key(vb.VllmBackend({**base, "dtype": "float16"}).identity(), "p") == keys["half"]
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda native=native: native)
        backend = vb.VllmBackend({**base, "dtype": "native"})
        assert backend.dtype == expected
        assert cache_key(backend.identity(), "p") == (keys["bfloat16"] if native else float32)
    with pytest.raises(ValueError, match="not engine_args.dtype"):
        vb.VllmBackend({**base, "engine_args": {"dtype": "half"}})


def test_vllm_cache_keys_of_existing_caches_are_pinned(monkeypatch):
    """The keys that existing cache.jsonl entries hold, computed before `auto` got its own key: the
    default smollm2 settings (`native`, bfloat16 on this kind of CPU) and float32 must keep hitting."""
    import pipeline.backends.vllm_backend as vb
    import pipeline.hardware as hardware

    monkeypatch.setattr(vb, "_on_cpu", lambda: True)
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    spec = {
        "backend": "vllm",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",  # a hub id: no model digest in the key
        "datasets": ["alpaca_eval"],
        "max_prompts_per_dataset": 60,
        "k": 4,
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 256,
        "seed": 42,
        "dtype": "native",
        "max_num_seqs": 64,
        "max_model_len": 2048,
    }
    pinned = {
        "native": "6edb827a54a2ebb1c776c14eee7d305bac56495addd9af50996e1162d6f42e8b",
        "bfloat16": "6edb827a54a2ebb1c776c14eee7d305bac56495addd9af50996e1162d6f42e8b",
        "float32": "387fbcad650db2bd504308724dd7e3a584a922931bc2d0929fd14a4752ad72e3",
        "float": "387fbcad650db2bd504308724dd7e3a584a922931bc2d0929fd14a4752ad72e3",
        "half": "dfe8689eb7d1f52d005441ec2e05161bc4ebec059d9490fb47613335acd5881d",
    }
    for dtype, key in pinned.items():
        assert cache_key(vb.VllmBackend({**spec, "dtype": dtype}).identity(), "Hello") == key, dtype


def test_vllm_native_dtype_on_a_gpu_needs_compute_capability_8(monkeypatch):
    """On a GPU `native` is bfloat16 from compute capability 8.0 (vLLM refuses it below) and float16 under."""
    from vllm.platforms import current_platform

    from pipeline.backends.vllm_backend import resolve_dtype

    for capable, expected in ((True, "bfloat16"), (False, "float16")):
        monkeypatch.setattr(current_platform, "has_device_capability", lambda cap, capable=capable: capable)
        assert resolve_dtype("native", cpu=False) == expected
    assert resolve_dtype("half", cpu=False) == "half"


@pytest.mark.parametrize(
    "backend, key",
    [(backend, key) for backend in ("vllm", "openai") for key in REQUIRED[backend]],
)
def test_a_backend_made_without_a_setting_that_decides_the_answers_names_it(backend, key):
    """No default in code for k, the sampling, the seed, the dtype or max_model_len: a backend made
    without generate's checks (a benchmark, a test) refuses to start rather than pick a number."""
    from pipeline.backends import make_backend

    spec = backend_spec(backend, model="m", base_url="http://localhost:1/v1", without=(key,))
    if backend == "vllm":
        spec.pop("base_url")
    with pytest.raises(ValueError, match=f"^{backend} backend: params need `{key}` "):
        make_backend(backend, spec)
    make_backend(backend, {**spec, key: backend_spec(backend)[key]})  # with it, it is made


def test_the_required_settings_are_options_and_decide_the_cache_key():
    """What a backend requires it also accepts (OPTIONS), and each is in its cache key but
    max_model_len, which decides which prompts are answered (the rest are skipped), not the answers."""
    import pipeline.backends.vllm_backend as vb

    assert set(REQUIRED["vllm"]) <= OPTIONS["vllm"] and set(REQUIRED["openai"]) <= OPTIONS["openai"]
    vllm = vb.VllmBackend(backend_spec("vllm", model="m")).identity()
    assert set(REQUIRED["vllm"]) - set(vllm) == {"max_model_len"}
    openai = OpenAIBackend(backend_spec("openai", model="m", base_url="http://localhost:1/v1")).identity()
    assert set(REQUIRED["openai"]) <= set(openai)


def test_vllm_passes_speed_settings_only_when_the_entry_sets_them(monkeypatch, capsys):
    """max_num_seqs, tensor_parallel_size, enforce_eager, gpu_memory_utilization, cpu_kv_cache_gib and
    repetition_penalty left out are not passed: vLLM's own defaults apply, not a second set in our code.
    The settings that decide the answers are always the entry's."""
    import vllm

    import pipeline.backends.vllm_backend as vb

    made = []
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: made.append(kwargs) or object())
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    spec = backend_spec("vllm", model="m", seed=7, max_model_len=1024, dtype="float32")
    for cpu in (True, False):
        monkeypatch.setattr(vb, "_on_cpu", lambda cpu=cpu: cpu)
        vb.VllmBackend(spec).start()
        assert made.pop() == {"model": "m", "dtype": "float32", "seed": 7, "max_model_len": 1024}
        assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    set_ = {"max_num_seqs": 8, "tensor_parallel_size": 2, "enforce_eager": True, "gpu_memory_utilization": 0.8}
    vb.VllmBackend({**spec, **set_, "cpu_kv_cache_gib": 3}).start()  # on a GPU (the last _on_cpu)
    assert made.pop() == {"model": "m", "dtype": "float32", "seed": 7, "max_model_len": 1024, **set_}
    assert "gpu_memory_utilization" not in capsys.readouterr().err
    monkeypatch.setattr(vb, "_on_cpu", lambda: True)
    vb.VllmBackend({**spec, **set_, "cpu_kv_cache_gib": 3}).start()  # gpu_memory_utilization: a GPU's
    assert "gpu_memory_utilization is a GPU's share of memory and is not used on a CPU" in capsys.readouterr().err
    on_cpu = {key: value for key, value in set_.items() if key != "gpu_memory_utilization"}
    assert made.pop() == {"model": "m", "dtype": "float32", "seed": 7, "max_model_len": 1024, **on_cpu}
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert vb.VllmBackend(spec)._sampling().repetition_penalty == 1.0  # SamplingParams' own: no penalty
    assert vb.VllmBackend({**spec, "repetition_penalty": 1.1})._sampling().repetition_penalty == 1.1


def test_a_cut_answer_is_length_whatever_cut_it():
    """Cut at max_tokens, by a content filter or an abort: a lower bound (the pairs' censoring rule)."""
    from pipeline.backends.base import normalise_finish_reason

    for reason in ("length", "content_filter", "abort"):
        assert normalise_finish_reason(reason) == "length"
    for reason in ("stop", "tool_calls", "eos", None):
        assert normalise_finish_reason(reason) == "stop"


def test_which_refusals_are_the_prompts():
    from pipeline.backends.openai_backend import refuses_the_prompt

    for status, body in [
        (400, '{"error": {"code": "context_length_exceeded", "message": "..."}}'),
        (400, "This model's maximum context length is 8192 tokens. However, you requested 9000"),
        (400, '{"error": {"code": "content_filter"}}'),
        (400, '{"error": {"code": "invalid_prompt", "message": "flagged as potentially violating"}}'),
        (413, "Payload Too Large"),
    ]:
        assert refuses_the_prompt(status, body)
    for status, body in [
        (400, '{"error": {"message": "Unrecognized request argument supplied: reasoning_effortt"}}'),
        (400, "Unsupported parameter: 'max_tokens' is not supported with this model."),
        (422, '{"detail": [{"loc": ["body", "temperature"], "msg": "value is not a valid float"}]}'),
        (401, "context length"),
        (404, "The model does not exist"),
    ]:
        assert not refuses_the_prompt(status, body)


def test_openai_answer_with_a_lone_closing_tag_splits_its_trace():
    """An R1-style model served without a reasoning parser: its template opened <think> in the
    prompt, which the endpoint does not show, so the content holds only the closing tag."""
    sample, estimated = OpenAIBackend._parse(
        {
            "choices": [{"message": {"content": "plan it</think>The answer."}, "finish_reason": "stop"}],
            "usage": {"completion_tokens": 6, "prompt_tokens": 3},
        }
    )
    assert (sample.reasoning, sample.text) == ("plan it", "The answer.")
    assert estimated and sample.reasoning_tokens == round(6 * 7 / 18)  # no count sent: estimated


def test_openai_plain_answer_keeps_its_text():
    sample, estimated = OpenAIBackend._parse(
        {
            "choices": [{"message": {"content": "The answer is 4."}, "finish_reason": "stop"}],
            "usage": {"completion_tokens": 5, "prompt_tokens": 3},
        }
    )
    assert (sample.reasoning, sample.text) == ("", "The answer is 4.")
    assert not estimated and sample.reasoning_tokens == 0


def test_openai_trace_the_endpoint_does_not_count_gets_an_estimate_not_zero():
    """vLLM's server returns reasoning_content without completion_tokens_details: the trace's
    tokens are estimated from its character share, not reported as 0."""
    sample, estimated = OpenAIBackend._parse(
        {
            "choices": [
                {"message": {"content": "Four.", "reasoning_content": "2 + 2 is four, so"}, "finish_reason": "stop"}
            ],
            "usage": {"completion_tokens": 12, "prompt_tokens": 3},
        }
    )
    assert (sample.reasoning, sample.text, sample.output_tokens) == ("2 + 2 is four, so", "Four.", 12)
    assert sample.reasoning_tokens == round(12 * 17 / 22) == 9 and estimated
    reported, estimated_again = OpenAIBackend._parse(
        {
            "choices": [
                {"message": {"content": "Four.", "reasoning_content": "2 + 2 is four, so"}, "finish_reason": "stop"}
            ],
            "usage": {"completion_tokens": 11, "completion_tokens_details": {"reasoning_tokens": 6}},
        }
    )
    assert reported.reasoning_tokens == 6 and not estimated_again
    assert estimated_reasoning_tokens(11, "", "Four.") == 0
