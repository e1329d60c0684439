"""The `openai` backend: any OpenAI-compatible chat endpoint (OpenAI, a remote `vllm serve`, ...).

One request per sample (n=1), so `usage.completion_tokens` is that sample's exact token count;
per the API it includes reasoning tokens (`completion_tokens_details.reasoning_tokens`), and a
reasoning text returned apart (`reasoning_content` / `reasoning`) or inline as <think>…</think>
is split out. At most `concurrency` requests are in flight; timeouts, connection errors, 408,
429 and 5xx are retried with exponential backoff (honouring Retry-After); any other 4xx stops
the run with the server's message. Prompts finished before an error are already saved.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import threading
from typing import Any, Iterable, Iterator

from pipeline.backends.base import Backend, PromptItem, Sample, normalise_finish_reason, split_reasoning

RETRYABLE = {408, 409, 429, 500, 502, 503, 504}


class EndpointError(RuntimeError):
    """The endpoint refused a request (4xx) or kept failing after every retry."""


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        for key in ("base_url", "model"):
            if not self.spec.get(key):
                raise ValueError(f"openai backend: params need `{key}`")
        self.base_url = str(self.spec["base_url"]).rstrip("/")
        self.k = int(self.spec.get("k", 1))
        self.concurrency = int(self.spec.get("concurrency", 8))
        self.max_retries = int(self.spec.get("max_retries", 6))
        self.timeout = float(self.spec.get("timeout_s", 120))
        self.backoff = float(self.spec.get("backoff_s", 1.0))
        self.api_key = os.environ.get(self.spec.get("api_key_env", "OPENAI_API_KEY"), "EMPTY")
        self.skipped: dict[str, str] = {}
        self.retries = 0

    def identity(self) -> dict[str, Any]:
        s = self.spec
        return {"backend": self.name, "base_url": self.base_url, "model": s["model"], "k": self.k,
                "temperature": float(s.get("temperature", 0.7)), "top_p": float(s.get("top_p", 1.0)),
                "max_tokens": int(s.get("max_tokens", 1024))}

    def describe(self) -> dict[str, Any]:
        return {**self.identity(), "tokenizer": "the endpoint's (usage.completion_tokens)",
                "concurrency": self.concurrency, "retries_this_run": self.retries}

    def _body(self, prompt: str) -> dict[str, Any]:
        ident = self.identity()
        body = {"model": ident["model"], "messages": [{"role": "user", "content": prompt}],
                "temperature": ident["temperature"], "top_p": ident["top_p"], "n": 1}
        # reasoning models on OpenAI take max_completion_tokens; most servers accept max_tokens
        body[self.spec.get("max_tokens_field", "max_tokens")] = ident["max_tokens"]
        body.update(self.spec.get("extra_body", {}))
        return body

    async def _one(self, client, sem: asyncio.Semaphore, prompt: str) -> Sample:
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            async with sem:
                try:
                    resp = await client.post(f"{self.base_url}/chat/completions", json=self._body(prompt))
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    resp, last = None, f"{exc.__class__.__name__}: {exc}"
            if resp is not None:
                if resp.status_code == 200:
                    return self._parse(resp.json())
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
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
    def _parse(data: dict[str, Any]) -> Sample:
        try:
            choice = data["choices"][0]
            message = choice["message"]
            usage = data["usage"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"response without choices/usage: {str(data)[:300]}") from exc
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        if not reasoning:
            reasoning, content = split_reasoning(content)
        details = usage.get("completion_tokens_details") or {}
        return Sample(output_tokens=int(usage["completion_tokens"]),
                      reasoning_tokens=int(details.get("reasoning_tokens") or 0),
                      finish_reason=normalise_finish_reason(choice.get("finish_reason")),
                      prompt_tokens=int(usage.get("prompt_tokens") or 0), text=content, reasoning=reasoning)

    async def _run(self, items: list[PromptItem], out: queue.Queue) -> None:
        import httpx

        sem = asyncio.Semaphore(self.concurrency)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits) as client:
            async def prompt_task(item: PromptItem):
                samples = await asyncio.gather(*(self._one(client, sem, item.prompt) for _ in range(self.k)))
                out.put((item.prompt_id, list(samples)))

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
