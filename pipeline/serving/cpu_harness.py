"""Drive vLLM's real v1 Scheduler on the CPU, without a model: the harness of the scheduler tests
and of `benchmarks/scheduler_overhead.py`.

`model_dir()` writes a stand-in model (a tiny llama config.json plus a real tokenizer); `build_scheduler`
makes a real Scheduler (or a PARS one) over a KV cache of `num_blocks` blocks; `FakeEngine` answers
each SchedulerOutput with a ModelRunnerOutput, as vLLM's own scheduler tests do, and stands in for
the GPU. Everything else is vLLM's code and ours. Imports vLLM.
"""

from __future__ import annotations

import json
import shutil
from collections import deque
from pathlib import Path

BLOCK = 16
TOKEN = 7  # a sampled token that is neither EOS nor a stop token
# the tokenizer files model_dir copies beside the tiny config (those the source holds)
COPIED_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "chat_template.jinja",
    "merges.txt",
    "vocab.json",
)


def model_dir(path: Path, tokenizer_dir: Path | None = None, tokenizer=None) -> Path:
    """A stand-in served model: a tiny llama config.json and the tokenizer of `tokenizer_dir`
    (its files are copied) or of a loaded `tokenizer` (saved)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
        vocab = len(tokenizer)
    else:
        for name in COPIED_TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copy(Path(tokenizer_dir) / name, path / name)
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(path))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


def model_config(path: Path):
    from vllm.config import ModelConfig

    return ModelConfig(model=str(path), dtype="float32", seed=0, max_model_len=4096)


def build_scheduler(
    cls,
    model_cfg,
    *,
    max_num_seqs: int = 4,
    num_blocks: int = 1000,
    async_scheduling: bool = False,
    pars: dict | None = None,
    max_num_batched_tokens: int = 2048,
):
    """A real scheduler of `cls` with `num_blocks` KV blocks of BLOCK tokens; `pars` is its
    additional_config["pars"] (ignored by vLLM's own classes)."""
    import torch
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sched_cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=4096,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    vllm_config = VllmConfig(
        scheduler_config=sched_cfg,
        model_config=model_cfg,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        additional_config={"pars": dict(pars or {})},
    )
    # The CPU platform forces async scheduling off; the AsyncScheduler tests put it back.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
            )
        ],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        log_stats=False,
    )


class FakeEngine:
    """The GPU's stand-in. Mirrors EngineCore.step (sync) or step_with_batch_queue (async: the next
    step is scheduled before the previous one's output comes back). Time is the step count, unless
    `clock` is given (then the PARS queue keeps its wall clock)."""

    def __init__(self, scheduler, async_scheduling: bool = False, step_clock: bool = True):
        self.s = scheduler
        self.t = 0.0
        self.async_scheduling = async_scheduling
        if step_clock and hasattr(scheduler, "waiting") and hasattr(scheduler.waiting, "clock"):
            scheduler.waiting.clock = lambda: self.t
        self.in_flight: deque = deque()
        self.finished: list[str] = []
        self.admitted: list[tuple[float, str]] = []  # (step, request id), in admission order
        self.preempted: list[tuple[float, str]] = []
        self.arrival: dict[str, float] = {}
        self._n = 0

    def add(
        self,
        rid: str,
        prompt_len: int,
        out_len: int,
        score: float | None = None,
        prompt_ids: list[int] | None = None,
        arrival: float | None = None,
        priority: int = 0,
    ):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        extra = {"pars_score": score} if score is not None else None
        params = SamplingParams(max_tokens=out_len, ignore_eos=True, extra_args=extra)
        # Distinct arrival times (a tiny offset per request) make "oldest" well defined.
        self._n += 1
        arrival = (self.t if arrival is None else arrival) + self._n * 1e-6
        ids = prompt_ids if prompt_ids is not None else [1000 + self._n % 500] * prompt_len
        self.arrival[rid] = arrival
        self.s.add_request(
            Request(
                request_id=rid,
                prompt_token_ids=ids,
                sampling_params=params,
                pooling_params=None,
                arrival_time=arrival,
                priority=priority,
            )
        )

    def _process(self, item):
        from vllm.v1.outputs import ModelRunnerOutput

        out, sampled = item
        req_ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[sampled[r] for r in req_ids],
        )
        for eco in self.s.update_from_output(out, mro).values():
            self.finished.extend(o.request_id for o in eco.outputs if o.finish_reason is not None)

    def step(self) -> None:
        before = {r.request_id for r in self.s.running}
        out = self.s.schedule()
        for r in self.s.running:
            if r.request_id not in before:
                self.admitted.append((self.t, r.request_id))
        self.preempted.extend((self.t, rid) for rid in (out.preempted_req_ids or ()))
        # A request whose prefill completes this step samples one token.
        sampled = {rid: ([] if self.s.requests[rid].is_prefill_chunk else [TOKEN]) for rid in out.num_scheduled_tokens}
        self.in_flight.append((out, sampled))
        # Sync: answer at once. Async: keep one step in flight; drain when nothing new was scheduled.
        keep = 1 if self.async_scheduling and out.num_scheduled_tokens else 0
        while len(self.in_flight) > keep:
            self._process(self.in_flight.popleft())
        self.t += 1

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.s.has_requests() and not self.in_flight:
                return
            self.step()
        raise AssertionError(f"engine did not drain in {max_steps} steps")

    def order(self) -> list[str]:
        return [rid for _, rid in self.admitted]
