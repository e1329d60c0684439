"""How fast the serving simulator runs: requests simulated per second on one core.

Target (issue 6): one million requests in under a minute. The workload is the document's 1:1
(prompt and answer lengths U(10, 1600), M = 131,000 KV tokens, chunk 512) at Poisson arrivals
just past saturation (1.05 mu: the hardest regime, memory full and preemptions happening), plus
a burst, with FCFS and with oracle SJF keys.

    python benchmarks/simulator_speed.py            # 1,000,000 requests
    python benchmarks/simulator_speed.py -n 100000  # quicker
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.queueing import theory  # noqa: E402
from pipeline.queueing.policies import policy_key  # noqa: E402
from pipeline.queueing.simulator import HAVE_NUMBA, EngineConfig, burst, poisson, simulate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--requests", type=int, default=1_000_000)
    ap.add_argument("--load", type=float, default=1.05, help="arrival rate as a multiple of mu")
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    cfg = EngineConfig(
        M=131_000, chunk=512, token_budget=8192, max_num_seqs=256, block_size=args.block_size, step_c0=0.04
    )
    w = theory.document_workloads()["1:1"]
    cap = theory.capacity(w, cfg.M, cfg.chunk, cfg.step_c0)
    s, o = w.sample(args.requests, rng)

    t = time.perf_counter()
    simulate(burst(100), s[:100], o[:100], config=cfg)  # compile (or load numba's cache)
    print(f"numba: {HAVE_NUMBA}; compile/warm-up {time.perf_counter() - t:.1f} s")

    cases = [
        (f"poisson {args.load:.2f} mu, fcfs", poisson(args.requests, args.load * cap.mu, rng), "fcfs"),
        (f"poisson {args.load:.2f} mu, oracle", poisson(args.requests, args.load * cap.mu, rng), "oracle"),
        ("burst, fcfs", burst(args.requests), "fcfs"),
    ]
    for name, arrival, policy in cases:
        key = policy_key(policy, arrival, o)
        t = time.perf_counter()
        r = simulate(arrival, s, o, key=key, config=cfg)
        el = time.perf_counter() - t
        print(
            f"{name:28s} {args.requests:>9,d} requests in {el:6.2f} s = {args.requests / el:12,.0f} requests/s "
            f"({r.steps:,d} engine steps, {r.skipped_steps / max(r.steps, 1):.0%} skipped, "
            f"{int(r.preemptions.sum()):,d} preemptions, simulated {r.finish.max() / 3600:.1f} h)"
        )
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    sys.exit(run_script(main))
