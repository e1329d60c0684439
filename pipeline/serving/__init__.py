"""Serving: the exported checkpoint, the Scorer that reads it, and the vLLM scheduler.

Nothing here imports Lightning; the vLLM scheduler (`pipeline.serving.vllm_scheduler`)
is the only module that imports vLLM, and only when it is used.
"""

from pipeline.ranking.checkpoint import CheckpointError, save_checkpoint
from pipeline.serving.scorer import Scorer

__all__ = ["CheckpointError", "Scorer", "save_checkpoint"]
