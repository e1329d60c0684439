"""Is bfloat16 training worth it on this CPU? One training step of the layers `train` fine-tunes
(MiniLM-L6's top 3 layers, batch 32 x 128 tokens, forward + backward) in 32-true and under bf16
autocast, side by side, and what `train.lightning.precision: auto` picks here.

    python benchmarks/precision_probe.py [--steps 4] [--json metrics/choices/precision_probe.json]

On a CPU with native bfloat16 (AVX512-BF16 / AMX) bf16 is the faster one; without it, bf16 is
emulated and many times slower, which is why `auto` takes 32-true there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def step_seconds(layers, x, bf16: bool, steps: int) -> float:
    """Median seconds of `steps` forward + backward passes (after one warm-up)."""
    import torch

    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            h = x
            for layer in layers:
                out = layer(h)
                h = out[0] if isinstance(out, tuple) else out
            loss = h.float().mean()
        loss.backward()
        times.append(time.perf_counter() - start)
    times = sorted(times[1:])
    return times[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModel

    from pipeline.hardware import cpu_has_native_bf16, cpu_name
    from pipeline.ranking.model import resolve_encoder
    from pipeline.train import resolve_precision

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    encoder = AutoModel.from_pretrained(resolve_encoder("minilm-l6"))
    layers = encoder.encoder.layer[3:]
    x = torch.randn(32, 128, encoder.config.hidden_size)
    fp32 = step_seconds(layers, x, False, args.steps)
    bf16 = step_seconds(layers, x, True, args.steps)
    result = {
        "cpu": cpu_name(),
        "native_bf16": cpu_has_native_bf16(),
        "auto_resolves_to": resolve_precision("auto", "cpu"),
        "threads": args.threads,
        "step": "MiniLM-L6 layers 4-6, batch 32 x 128 tokens, forward + backward",
        "seconds_per_step_32_true": round(fp32, 4),
        "seconds_per_step_bf16_autocast": round(bf16, 4),
        "bf16_over_32_true": round(bf16 / fp32, 2),
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
