"""The `openai` backend: any OpenAI-compatible chat endpoint (OpenAI, a remote `vllm serve`, ...).

One request per sample (n=1), so `usage.completion_tokens` is that sample's exact token count;
per the API it includes reasoning tokens (`completion_tokens_details.reasoning_tokens`), and a
reasoning text returned apart (`reasoning_content` / `reasoning`) or inline as <think>…</think>
is split out (a trace returned without its count gets an estimate, `estimated_reasoning_tokens`,
counted in meta.json). At most `concurrency` requests are in flight; timeouts, connection errors,
408, 429 and 5xx are retried with exponential backoff (honouring Retry-After); a prompt the server
refuses as such (over the context length, flagged: `refuses_the_prompt`) is skipped and listed;
any other 4xx stops the run with the server's message. Prompts finished before an error are
already saved.

Failing fast (each knob settable per model spec): before the first request the endpoint must
answer anything at all (GET <base_url>/models, `connect_timeout_s` = 10 s, 3 tries), so an
unreachable or hanging endpoint fails in well under a minute, naming the URL. Later, a request
that gets no answer in `timeout_s` (60 s) is tried once more, then the run stops: a second
timeout in a row means a hung endpoint, not a busy one (about two minutes, not 15).

The sampling (k, temperature, top_p, max_tokens: REQUIRED["openai"]) comes from the model's entry
alone; the client's knobs above have the defaults below when the entry leaves them out.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import re
import threading
from typing import Any, Iterable, Iterator

from pipeline.backends import REQUIRED
from pipeline.backends.base import Backend, PromptItem, Sample, normalise_finish_reason, require, split_reasoning
from pipeline.errors import PARSError

# The client's defaults, for an entry that leaves the key out. Not in params.yaml: they change neither
# the answers nor the cache key, only how fast the endpoint is asked and how long a failing one is
# waited for, and they belong to the endpoint more than to a model (params.yaml has no openai entry to
# hold them); an entry sets its own where its endpoint needs it (the production profile's gpt-4 sets
# timeout_s and max_retries). The client needs a number for each: "the server's default" is no timeout.
CONCURRENCY = 8  # requests in flight (`concurrency`)
MAX_RETRIES = 6  # tries after the first, with exponential backoff (`max_retries`): ~1 min at backoff_s 1
TIMEOUT_S = 60.0  # a request's answer (`timeout_s`); twice in a row stops the run (a hung endpoint)
CONNECT_TIMEOUT_S = 10.0  # a connection, and the probe before the first request (`connect_timeout_s`)
BACKOFF_S = 1.0  # the first retry's wait, doubled each retry (`backoff_s`)
# the request field max_tokens goes in (`max_tokens_field`): the chat API's own name, which most
# servers accept; OpenAI's reasoning models take max_completion_tokens. A name, not a value.
MAX_TOKENS_FIELD = "max_tokens"
_NO_DEFAULT = object()  # _number's default for a key the entry must set (REQUIRED)

RETRYABLE = {408, 409, 429, 500, 502, 503, 504}
# A refusal of this prompt, not of the params: 413, or a 400/422 whose body says the prompt is over
# the context length or flagged (OpenAI's codes context_length_exceeded, content_filter,
# invalid_prompt; vLLM's "maximum context length" message). That prompt is skipped and listed in
# meta.json and the run goes on. Any other 4xx (a bad field in extra_body, a wrong model name, a
# bad key) stops the run, as it would fail every prompt alike.
PROMPT_REFUSALS = re.compile(
    r"context[ _]length|maximum context|too long|content[ _]?(filter|policy|management)|invalid_prompt|flagged",
    re.IGNORECASE,
)


def refuses_the_prompt(status: int, body: str) -> bool:
    return status == 413 or (status in (400, 422) and PROMPT_REFUSALS.search(body) is not None)


def estimated_reasoning_tokens(output_tokens: int, reasoning: str, answer: str) -> int:
    """The completion's tokens split by the reasoning text's share of the characters: for an
    endpoint that returns a trace without counting it (vLLM's server leaves
    `completion_tokens_details` out). No trace: 0. meta.json's
    `reasoning_tokens_estimated_this_run` counts the samples so counted."""
    if not reasoning:
        return 0
    return round(output_tokens * len(reasoning) / (len(reasoning) + len(answer)))


class EndpointError(PARSError, RuntimeError):
    """The endpoint is unreachable, refused a request (4xx) or kept failing after every retry."""


class PromptRefused(EndpointError):
    """The endpoint refused this prompt (refuses_the_prompt): the prompt is skipped."""


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        for key in ("base_url", "model"):
            if not self.spec.get(key):
                raise ValueError(f"openai backend: params need `{key}`")
        self.base_url = str(self.spec["base_url"]).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"openai backend: base_url {self.base_url!r} is not an http:// or https:// URL")
        require(self.spec, REQUIRED[self.name], self.name)
        number = self._number
        self.k = number("k", int)
        self.concurrency = number("concurrency", int, CONCURRENCY)
        self.max_retries = number("max_retries", int, MAX_RETRIES)
        self.timeout = number("timeout_s", float, TIMEOUT_S)
        self.connect_timeout = number("connect_timeout_s", float, CONNECT_TIMEOUT_S)
        self.backoff = number("backoff_s", float, BACKOFF_S)
        for key, kind in (("temperature", float), ("top_p", float), ("max_tokens", int)):
            number(key, kind)  # checked here, used in identity()
        for key, value in (
            ("concurrency", self.concurrency),
            ("k", self.k),
            ("timeout_s", self.timeout),
            ("connect_timeout_s", self.connect_timeout),
        ):
            if not value > 0 or value == float("inf"):
                raise ValueError(f"openai backend: `{key}` must be a positive finite number, got {value}")
        if self.max_retries < 0 or not self.backoff >= 0:
            raise ValueError("openai backend: `max_retries` and `backoff_s` must be >= 0")
        key_env = self.spec.get("api_key_env")
        if key_env is not None and not os.environ.get(str(key_env)):
            # named on purpose: an endpoint that needs a key would refuse every request, after the sampling started
            raise ValueError(f"openai backend: `api_key_env` names {key_env}, which is not set in the environment")
        # unnamed: OPENAI_API_KEY when set, else a placeholder (local servers such as vLLM's take any key)
        self.api_key = os.environ.get(str(key_env or "OPENAI_API_KEY")) or "EMPTY"
        self.skipped: dict[str, str] = {}
        self.retries = 0
        self.reasoning_estimated = 0  # samples whose reasoning_tokens the endpoint did not report

    def _number(self, key: str, kind, default=_NO_DEFAULT):
        """A numeric spec value, or one line naming the key (`concurrency: abc` is not a traceback);
        `default` when the spec leaves the key out, if the key has one (REQUIRED keys have none)."""
        raw = self.spec[key] if default is _NO_DEFAULT else self.spec.get(key, default)
        try:
            if isinstance(raw, bool) or (kind is int and isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return kind(raw)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(
                f"openai backend: `{key}` must be {'an integer' if kind is int else 'a number'}, " f"got {raw!r}"
            ) from None

    def identity(self) -> dict[str, Any]:
        s = self.spec
        ident = {
            "backend": self.name,
            "base_url": self.base_url,
            "model": s["model"],
            "k": self.k,
            "temperature": float(s["temperature"]),
            "top_p": float(s["top_p"]),
            "max_tokens": int(s["max_tokens"]),
        }
        # request fields such as reasoning_effort change the answers: in the key when set (so
        # caches made without them keep their keys)
        if s.get("extra_body"):
            ident["extra_body"] = dict(s["extra_body"])
        return ident

    def describe(self) -> dict[str, Any]:
        return {
            **self.identity(),
            "tokenizer": "the endpoint's (usage.completion_tokens)",
            "concurrency": self.concurrency,
            "retries_this_run": self.retries,
            "reasoning_tokens_estimated_this_run": self.reasoning_estimated,
        }

    def _body(self, prompt: str) -> dict[str, Any]:
        ident = self.identity()
        body = {
            "model": ident["model"],
            "messages": [{"role": "user", "content": prompt}],
            "temperature": ident["temperature"],
            "top_p": ident["top_p"],
            "n": 1,
        }
        # reasoning models on OpenAI take max_completion_tokens; most servers accept max_tokens
        body[self.spec.get("max_tokens_field", MAX_TOKENS_FIELD)] = ident["max_tokens"]
        body.update(self.spec.get("extra_body", {}))
        return body

    async def _one(self, client, sem: asyncio.Semaphore, prompt: str) -> Sample:
        import httpx

        last, timeouts = "", 0
        for attempt in range(self.max_retries + 1):
            async with sem:
                try:
                    resp = await client.post(f"{self.base_url}/chat/completions", json=self._body(prompt))
                    timeouts = 0
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    resp, last = None, f"{exc.__class__.__name__}: {exc}"
                    timeouts = timeouts + 1 if isinstance(exc, httpx.TimeoutException) else 0
            if timeouts >= 2:  # hung, not busy: stop instead of waiting timeout_s per retry
                raise EndpointError(
                    f"{self.base_url} did not answer in {self.timeout:g} s, twice in a row ({last}); "
                    f"raise timeout_s in the model's params if its answers are that slow"
                )
            if resp is not None:
                if resp.status_code == 200:
                    try:
                        data = resp.json()
                    except ValueError:
                        raise EndpointError(
                            f"{self.base_url} answered with a body that is not JSON: " f"{resp.text[:300]!r}"
                        ) from None
                    sample, estimated = self._parse(data, self.base_url)
                    self.reasoning_estimated += estimated
                    return sample
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if refuses_the_prompt(resp.status_code, resp.text):
                    raise PromptRefused(last)
                if resp.status_code not in RETRYABLE:
                    raise EndpointError(f"{self.base_url} refused the request ({last})")
            if attempt == self.max_retries:
                break
            self.retries += 1
            delay = self.backoff * (2**attempt) * (0.5 + random.random())
            if resp is not None and resp.headers.get("retry-after", "").replace(".", "", 1).isdigit():
                delay = max(delay, float(resp.headers["retry-after"]))
            await asyncio.sleep(delay)
        raise EndpointError(f"{self.base_url} still failing after {self.max_retries} retries ({last})")

    @staticmethod
    def _parse(data: Any, where: str = "the endpoint") -> tuple[Sample, bool]:
        """The sample, and whether its reasoning_tokens are an estimate (the endpoint sent a trace
        without its count)."""
        try:
            choice = data["choices"][0]
            message = choice["message"]
            usage = data["usage"]
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            if not reasoning:
                # the endpoint's chat template is not visible here: a lone closing tag may end a
                # trace the template opened (an R1-style model served without a reasoning parser);
                # without one, a plain answer stays the answer
                reasoning, content = split_reasoning(content, opened="</think>" in content)
            details = usage.get("completion_tokens_details") or {}
            output_tokens = int(usage["completion_tokens"])
            reported = details.get("reasoning_tokens")
            sample = Sample(
                output_tokens=output_tokens,
                reasoning_tokens=(
                    int(reported)
                    if reported is not None
                    else estimated_reasoning_tokens(output_tokens, reasoning, content)
                ),
                finish_reason=normalise_finish_reason(choice.get("finish_reason")),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                text=content,
                reasoning=reasoning,
            )
            return sample, reported is None and bool(reasoning)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            # a server that is not OpenAI-compatible: name it, never a traceback
            raise EndpointError(
                f"{where}: response without usable choices/usage ({exc.__class__.__name__}: "
                f"{exc}): {str(data)[:300]}"
            ) from exc

    async def _probe(self, client, tries: int = 3) -> None:
        """Any HTTP answer (even 401 or 404) shows the endpoint is there; no answer at all within
        connect_timeout_s, `tries` times, is an unreachable or hung endpoint: one clear error."""
        import httpx

        for attempt in range(tries):
            try:
                await client.get(f"{self.base_url}/models", timeout=self.connect_timeout)
                return
            except httpx.InvalidURL as exc:
                raise EndpointError(f"{self.base_url} is not a valid URL ({exc})") from None
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__
            if attempt + 1 < tries:
                await asyncio.sleep(self.backoff * (2**attempt))
        raise EndpointError(
            f"{self.base_url} is unreachable ({last}; {tries} tries, each "
            f"allowed {self.connect_timeout:g} s); check base_url and that the server is up"
        )

    async def _run(self, items: list[PromptItem], out: queue.Queue) -> None:
        import httpx

        sem = asyncio.Semaphore(self.concurrency)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        limits = httpx.Limits(max_connections=self.concurrency)
        timeout = httpx.Timeout(self.timeout, connect=self.connect_timeout)
        async with httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits) as client:
            if items:
                await self._probe(client)

            async def prompt_task(item: PromptItem):
                samples = await asyncio.gather(
                    *(self._one(client, sem, item.prompt) for _ in range(self.k)), return_exceptions=True
                )
                errors = [s for s in samples if isinstance(s, BaseException)]
                for error in errors:
                    if not isinstance(error, PromptRefused):
                        raise error
                if errors:  # every refused prompt is listed; a run with no answer at all stops (generate)
                    self.skipped[item.prompt_id] = f"refused by the endpoint ({errors[0]})"
                else:
                    out.put((item.prompt_id, samples))

            tasks = [asyncio.create_task(prompt_task(it)) for it in items]
            try:
                for done in asyncio.as_completed(tasks):
                    await done
            finally:
                for t in tasks:
                    t.cancel()

    def generate(self, items: Iterable[PromptItem]) -> Iterator[tuple[str, list[Sample]]]:
        items = list(items)
        out: queue.Queue = queue.Queue()
        error: list[BaseException] = []

        def worker():
            try:
                asyncio.run(self._run(items, out))
            except BaseException as exc:  # handed to the caller's thread below
                error.append(exc)
            finally:
                out.put(None)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        while (result := out.get()) is not None:
            yield result
        thread.join()
        if error:
            raise error[0]
