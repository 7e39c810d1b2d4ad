"""vLLM's own parallelism for a model larger than one GPU, from a job's `resources:` placement.

The judge on its own devices: tensor parallel over `judge_gpus` of a box, and
on several boxes pipeline parallel over them with vLLM's Ray executor (what
vLLM documents for a model larger than one box: TP inside, PP across).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmParallelism:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    executor: str | None = None  # vLLM's distributed_executor_backend: None (its default) or "ray"

    def llm_args(self) -> dict:
        """Keyword arguments for vllm.LLM (nothing for one device: vLLM's defaults)."""
        args: dict = {}
        if self.tensor_parallel_size > 1:
            args["tensor_parallel_size"] = self.tensor_parallel_size
        if self.pipeline_parallel_size > 1:
            args["pipeline_parallel_size"] = self.pipeline_parallel_size
        if self.executor is not None:
            args["distributed_executor_backend"] = self.executor
        return args


def judge_parallelism(resources) -> VllmParallelism:
    """TP over the judge's devices of a box; PP over the boxes with Ray when the job has several."""
    if resources.judge_gpus == 0 or (resources.judge_gpus == 1 and resources.nodes == 1):
        return VllmParallelism()  # colocated with each rank, or one device of its own
    if resources.nodes > 1:  # vLLM spans boxes only through Ray
        return VllmParallelism(resources.judge_gpus, resources.nodes, "ray")
    return VllmParallelism(resources.judge_gpus)
