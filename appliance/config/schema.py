"""The job file as typed, frozen data (DESIGN.md, "Job file").

Pure data: no I/O, no model store, no torch. `job_file.py` turns YAML into these
models and reports errors with file, key and line; `appliance/job_checks.py` adds the checks
that need the outside world (model store, dataset files, reward registry).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from appliance.config import limits
from appliance.config.sizes import parse_memory_budget
from appliance.text_rules import Line, Text


class Spec(BaseModel):
    """Base for every section: unknown keys are errors, values are immutable."""

    # Infinity and NaN are never a setting; every number below also has an upper bound (config/limits.py).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _not_a_bool(value):
    # YAML's true/false are Python's bool, an int subclass: pydantic would read `steps: true` as 1.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


def Int(low: int, high: int):  # noqa: N802 (a type factory reads as a type)
    return Annotated[int, BeforeValidator(_not_a_bool), Field(ge=low, le=high)]


def Num(low: float, high: float, *, above: bool = False, below: bool = False):  # noqa: N802
    """A float in [low, high]; `above`/`below` make that end open."""
    bounds = {"gt" if above else "ge": low, "lt" if below else "le": high}
    return Annotated[float, BeforeValidator(_not_a_bool), Field(**bounds)]


Seed = Int(0, limits.MAX_SEED)
Steps = Int(1, limits.MAX_STEPS)
Tokens = Int(1, limits.MAX_TOKENS)
Seconds = Num(0.0, limits.MAX_SECONDS, above=True)
Name = Line(limits.MAX_NAME_CHARS, min_length=1)
PathText = Line(limits.MAX_PATH_CHARS, min_length=1)
# A key of a free-form mapping (environment_options, reward params, chat_template_kwargs) and its values.
Key = Line(limits.MAX_KEY_CHARS, min_length=1)
# Union, not "|": the client imports this module on CPython 3.9, where "|" of these types fails at import.
Scalar = Union[
    bool,
    Int(-limits.MAX_OPTION_NUMBER, limits.MAX_OPTION_NUMBER),
    Num(-limits.MAX_OPTION_NUMBER, limits.MAX_OPTION_NUMBER),
    Line(limits.MAX_OPTION_CHARS),
]
Options = Annotated[dict[Key, Scalar], Field(max_length=limits.MAX_OPTIONS)]


class LoraSpec(Spec):
    rank: Int(1, 1024) = 16
    alpha: Num(0.0, 1e4, above=True) = 32.0
    dropout: Num(0.0, 1.0, below=True) = 0.0
    target_modules: Annotated[list[Name], Field(min_length=1, max_length=64)] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class StudentSpec(Spec):
    model: PathText
    quantization: Literal["nf4", "fp4", "none"] = "nf4"
    lora: LoraSpec = LoraSpec()
    # auto: bf16 on CUDA, fp32 on the CPU, where bf16 without bf16 units is many times slower (bench/README.md,
    # "Figures behind constants in the code", "bf16 on the CPU").
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # null: the budget manager decides.
    gradient_checkpointing: bool | None = None


class JudgeSpec(Spec):
    # A model store name or folder; with `endpoint`, the model name the remote server serves.
    model: PathText
    # A judge on another box of the lab's network: an OpenAI-compatible server (vLLM serve),
    # e.g. http://judge.lab:8000/v1. Then no judge is loaded or planned on this device.
    endpoint: Line(limits.MAX_URL_CHARS) | None = None
    # A file holding the endpoint's API key (sent as a bearer token, never logged).
    token_file: PathText | None = None
    # Extra chat-template arguments (a local judge's tokenizer, or vLLM's chat_template_kwargs at an endpoint), e.g.
    # {enable_thinking: false} for a Qwen3 judge, which otherwise thinks before its score.
    chat_template_kwargs: Options = {}
    # Requests to the endpoint at once, and each one's timeout (retried `retries` times).
    concurrency: Annotated[int, Field(ge=1, le=256)] = 8
    request_timeout_seconds: Seconds = 60.0
    quantization: Literal["none", "nf4", "int8"] = "none"
    mode: Literal["pointwise", "group"] = "pointwise"
    # Group mode: how many orders each group is read in (an order and its reversal, then rotations and theirs;
    # judge/grouping.py); a response's score is the mean of its readings, so where it stood cancels out.
    group_orders: Int(2, 16) = 4
    # Group mode, a task whose reference holds a number, scores read from probabilities: each score is read
    # after the reference's entry at the top score and the response's final answer as the rules read it
    # (judge/grouping.py); false: the judge sees the reference only beside the question.
    group_anchor: bool = True
    rubric: Text(limits.MAX_PROSE_CHARS) | None = None
    # Numbers above 9 a probability-scored rubric may name because they are not scores ([100] for "answers over
    # 100 words"); any other is refused, since the judge reads one digit (judge/rubric.py).
    rubric_numbers: Annotated[list[Num(0.0, 1e12)], Field(max_length=64)] = []
    # probabilities: the score is read from the judge's next-token distribution (one forward pass,
    # no sampling); reasoned: the judge first writes a short rationale (up to max_new_tokens), then
    # the score is read from the distribution after it (G-Eval with reasoning); generate: the judge
    # writes a score and a short reason; auto: probabilities when the judge's engine gives
    # next-token log-probabilities (both built-in engines do).
    scoring: Literal["auto", "probabilities", "reasoned", "generate"] = "auto"
    # Probability scoring: a reading with less probability than this on the score tokens is a
    # failure (neutral score), not a score.
    min_score_mass: Num(0.0, 1.0, above=True) = 0.5
    # What a response whose judge reading failed gets: the mean of its group's judged responses
    # (no advantage either way), or the lowest score (a policy cannot escape the judge by breaking it).
    on_failure: Literal["group_mean", "minimum"] = "group_mean"
    # minimum: a response that addresses the grader (markers, control tokens, a score claim, "ignore the
    # instructions") gets the lowest score without being judged (judge/guard.py); off: judge it as any.
    injection_guard: Literal["minimum", "off"] = "minimum"
    # The differential check (judge/differential.py): a response to a task with a numeric answer is also judged
    # without its text outside the answer and its working; when the two scores differ by more than this, the
    # reward is the lower. 0: text outside the answer never raises the reward; null: the check is off.
    differential_threshold: Num(0.0, 1.0) | None = 0.0
    # The judge's context window in tokens; null: the engine's (vLLM max_model_len, the model's
    # positions). Longer judge prompts have their responses cut from the middle, and the cut logged.
    max_prompt_tokens: Tokens | None = None
    # Judge with the student's base weights (adapter disabled): weights held once.
    share_student_base: bool = False
    max_new_tokens: Tokens = 128
    temperature: Num(0.0, limits.MAX_TEMPERATURE) = 0.0
    retries: Int(0, 10) = 2
    timeout_seconds: Seconds = 300.0
    # Judge identical (question, reference, response) inputs once per job run.
    cache: bool = True
    # jobs/<id>/judge.jsonl rotates past this size, keeping log_backups older files.
    log_max_bytes: Int(1, limits.MAX_LOG_BYTES) = 64 * 1024 * 1024
    log_backups: Int(0, 100) = 3

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/@\s]+(/\S*)?$", value):
            raise ValueError(
                "endpoint must be an http(s) URL without credentials, like http://judge.lab:8000/v1 "
                "(put the API key in token_file)"
            )
        return value

    @model_validator(mode="after")
    def _remote(self) -> "JudgeSpec":
        if self.endpoint is None and self.token_file is not None:
            raise ValueError("token_file is for a remote judge; set endpoint too, or drop token_file")
        if self.endpoint is not None and self.share_student_base:
            raise ValueError(
                "share_student_base uses the student's weights on this box; "
                "a judge at an endpoint cannot share them (drop one of the two)"
            )
        return self


class FewShotExample(Spec):
    question: Text(limits.MAX_FEW_SHOT_CHARS)
    answer: Text(limits.MAX_FEW_SHOT_CHARS)


# Task keys that describe a dataset job; an agent job (task.environment) sets none of them.
DATASET_KEYS = frozenset({"dataset", "system_prompt", "few_shot", "operand_min", "operand_max", "held_out"})


class TaskSpec(Spec):
    dataset: PathText = "builtin:multiply"
    system_prompt: Text(limits.MAX_PROSE_CHARS) | None = None
    # Worked examples placed before the question as earlier chat turns.
    few_shot: Annotated[list[FewShotExample], Field(max_length=limits.MAX_FEW_SHOT)] = []
    # builtin:multiply operand range (inclusive); every ordered pair is a problem, at most MAX_MULTIPLY_PROBLEMS.
    operand_min: Int(-limits.MAX_OPERAND, limits.MAX_OPERAND) = 2
    operand_max: Int(-limits.MAX_OPERAND, limits.MAX_OPERAND) = 20
    # Problems kept out of training for evaluation (first N of the shuffled set).
    held_out: Int(0, limits.MAX_DATASET_ROWS) = 100
    seed: Seed = 0
    # An agent job: multi-turn rollouts in an environment with tools instead of a dataset of prompts.
    # builtin:calculator | builtin:email_search | builtin:game2048 | "file.py:Class" in <data-dir>/plugins/
    # | external (trajectory groups submitted through the student endpoint).
    environment: PathText | None = None
    # Keyword arguments for the environment's class (e.g. calculator: {operand_max: 50}), checked against its
    # parameters (job_checks.py).
    environment_options: Options = {}
    # Overrides the environment's own turn limit (assistant turns per rollout).
    max_turns: Int(1, 256) | None = None
    # External rollouts: a turn served more than this many steps before the step that trains it is refused.
    max_staleness: Int(0, 1000) = 1
    # Truncated trajectories (a turn cut at max_new_tokens, or cut to the planned length): trained as they are
    # (off), without their cut turns (turn), or not at all (trajectory). Rewards see `truncated` either way.
    mask_truncated: Literal["off", "turn", "trajectory"] = "off"

    @model_validator(mode="after")
    def _operand_range(self) -> "TaskSpec":
        if self.operand_min > self.operand_max:
            raise ValueError(f"operand_min ({self.operand_min}) must not exceed operand_max ({self.operand_max})")
        problems = (self.operand_max - self.operand_min + 1) ** 2  # counted, never built
        if problems > limits.MAX_MULTIPLY_PROBLEMS:
            raise ValueError(
                f"operands {self.operand_min}..{self.operand_max} make {problems} multiply problems, over the limit "
                f"of {limits.MAX_MULTIPLY_PROBLEMS}; narrow task.operand_min/task.operand_max"
            )
        return self

    def _changed(self, keys: set[str]) -> list[str]:
        """Keys set to something other than their default: a saved job.yaml (every key written out) is no conflict."""
        fields = type(self).model_fields
        return sorted(
            key
            for key in keys & self.model_fields_set
            if getattr(self, key) != fields[key].get_default(call_default_factory=True)
        )

    @model_validator(mode="after")
    def _environment_or_dataset(self) -> "TaskSpec":
        if self.environment is None:
            stray = self._changed({"environment_options", "max_turns", "max_staleness", "mask_truncated"})
            if stray:
                raise ValueError(
                    f"{' and '.join(stray)} {'apply' if len(stray) > 1 else 'applies'} to agent jobs only; "
                    f"set task.environment or drop {'them' if len(stray) > 1 else 'it'}"
                )
            return self
        stray = self._changed(DATASET_KEYS)
        if stray:
            raise ValueError(
                f"task.environment ({self.environment}) and {', '.join('task.' + key for key in stray)} exclude each "
                "other: an agent job's scenarios and prompts come from its environment; drop "
                + ("it" if len(stray) == 1 else "them")
                + " or drop task.environment"
            )
        return self


class RewardSpec(Spec):
    # A registered name (correctness, strict_format, judge, ...) or a plugin "path/to/file.py:function".
    name: PathText
    weight: Num(-limits.MAX_WEIGHT, limits.MAX_WEIGHT) = 1.0
    # Extra keyword arguments for the reward function (e.g. length: {target: 64}).
    params: Options = {}


class GrpoSpec(Spec):
    group_size: Int(2, limits.MAX_GROUP_SIZE) = 8
    prompts_per_step: Int(1, limits.MAX_PROMPTS_PER_STEP) = 4
    max_new_tokens: Tokens = 128
    # Longest prompt (chat template and few-shot included) the memory plan assumes.
    max_prompt_tokens: Tokens = 512
    temperature: Num(0.0, limits.MAX_TEMPERATURE, above=True) = 1.0
    top_p: Num(0.0, 1.0, above=True) = 1.0
    loss: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    epsilon: Num(0.0, 10.0, above=True) = 0.2
    # null: symmetric clipping with epsilon.
    epsilon_high: Num(0.0, 10.0, above=True) | None = 0.28
    beta: Num(0.0, 100.0) = 0.0
    # Divide group advantages by the group's reward std (false: Dr. GRPO style).
    scale_rewards: bool = True
    # bench/README.md "learning_curve.py": 3e-4 learned fastest of 5e-5, 1e-4, 2e-4 and 3e-4 on the plain job.
    learning_rate: Num(0.0, 1.0, above=True) = 3.0e-4
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: Int(0, limits.MAX_STEPS) = 0
    weight_decay: Num(0.0, 10.0) = 0.0
    max_grad_norm: Num(0.0, 1e6, above=True) = 1.0
    steps: Steps = 200
    # Optimizer passes over each rollout (old logprobs are stored).
    iterations: Int(1, 16) = 1
    # Sequences per forward/backward; null: the budget manager decides.
    micro_batch_size: Int(1, limits.MAX_GROUP_SIZE * limits.MAX_PROMPTS_PER_STEP) | None = None
    seed: Seed = 0
    # DAPO dynamic sampling: draw prompts_per_step more prompts while fewer than prompts_per_step groups of the
    # step have reward spread, at most max_sampling_rounds generation rounds a step (grpo/rollout.py).
    dynamic_sampling: bool = False
    max_sampling_rounds: Int(2, 16) = 3
    # Skip a prompt whose last N groups had no reward spread for its next N appearances, then try it again;
    # it is back for good once a group of it has spread. null: never skip (grpo/rollout.py).
    skip_settled_after: Int(1, 10_000) | None = None

    @model_validator(mode="after")
    def _rounds_need_dynamic_sampling(self) -> "GrpoSpec":
        default = type(self).model_fields["max_sampling_rounds"].default
        if self.max_sampling_rounds != default and not self.dynamic_sampling:
            raise ValueError(
                "max_sampling_rounds bounds dynamic sampling; set dynamic_sampling: true or drop max_sampling_rounds"
            )
        return self


class VllmSpec(Spec):
    # Cap for truncated importance sampling between vLLM's and the trainer's logprobs.
    importance_sampling_cap: Num(1.0, 1e3) = 2.0
    # Longest prompt + completion vLLM must hold; null: the lengths the budget plans with.
    max_model_len: Int(1, 2 * limits.MAX_TOKENS) | None = None
    # Ranks of a data-parallel job that share one vLLM copy of the student, tensor-parallel over their devices
    # (TRL's vllm_tensor_parallel_size); 1: every rank holds a whole copy. It divides the job's ranks.
    tensor_parallel_size: Int(1, limits.MAX_DEVICES) = 1


class EngineSpec(Spec):
    rollout: Literal["auto", "hf", "vllm"] = "auto"
    judge: Literal["auto", "hf", "vllm"] = "auto"
    # shared: generate with the trainer's own weights; merged_copy: a separate merged
    # copy in the compute dtype (faster, more memory); auto: the budget decides.
    rollout_weights: Literal["auto", "shared", "merged_copy"] = "auto"
    # The merged copy's dtype. compute: the student's compute dtype. bfloat16: half the copy's bytes, and on a
    # CPU with bf16 instructions about twice the generation speed of fp32; the trainer then corrects the gap
    # between the bf16 sampler and its own fp32 logprobs with truncated importance sampling, as for vLLM.
    # auto: bfloat16 for an fp32 student on a CPU with bf16 instructions (budget/device_probe.py), else compute.
    rollout_dtype: Literal["auto", "compute", "bfloat16"] = "auto"
    vllm: VllmSpec = VllmSpec()


class DeviceSpec(Spec):
    # A percentage of the device ("90%") or a size ("70GiB", 75161927680).
    memory_budget: Line(32) | Int(1, limits.MAX_MEMORY_BYTES) = "90%"

    @field_validator("memory_budget")
    @classmethod
    def _parseable(cls, value: str | int) -> str | int:
        parse_memory_budget(value, device_total_bytes=1 << 40)  # raises ValueError with the reason
        return value


class ResourcesSpec(Spec):
    """Devices a job uses (DESIGN.md, "Past one device"); one GPU on one box by default.

    `gpus` devices on each of `nodes` boxes. The student's devices each hold one data-parallel rank
    with its colocated rollout engine; the judge's devices hold the judge under vLLM tensor
    parallelism. With no judge_gpus the judge (if any) shares every student device.
    """

    gpus: Int(1, limits.MAX_DEVICES) = 1
    nodes: Int(1, limits.MAX_NODES) = 1
    # null: every device not given to the judge.
    student_gpus: Int(1, limits.MAX_DEVICES) | None = None
    # 0: the judge (if any) is colocated with each student rank; N: one judge over N devices (TP=N).
    judge_gpus: Int(0, limits.MAX_DEVICES) = 0
    # How each rank holds the 4-bit base: ddp (a whole copy per device), fsdp (sharded over the
    # student's devices, FSDP-QLoRA), auto (fsdp only when the base does not fit one device).
    sharding: Literal["auto", "ddp", "fsdp"] = "auto"

    @model_validator(mode="after")
    def _placement(self) -> "ResourcesSpec":
        student = self.gpus - self.judge_gpus if self.student_gpus is None else self.student_gpus
        if student < 1:
            raise ValueError(
                f"judge_gpus ({self.judge_gpus}) leaves no device of the {self.gpus} for the student; "
                "raise gpus or lower judge_gpus"
            )
        if student + self.judge_gpus > self.gpus:
            raise ValueError(
                f"student_gpus ({student}) + judge_gpus ({self.judge_gpus}) is more than gpus ({self.gpus}); "
                f"raise gpus to {student + self.judge_gpus} or lower the placement"
            )
        return self

    @property
    def student_devices(self) -> int:
        """Devices per box for the student's data-parallel ranks."""
        return self.gpus - self.judge_gpus if self.student_gpus is None else self.student_gpus

    @property
    def world_size(self) -> int:
        """Data-parallel ranks of the trainer over every box."""
        return self.student_devices * self.nodes


def greedy_samples_problem(temperature: float, samples: int) -> str | None:
    """What is wrong with drawing `samples` held-out samples at `temperature`, or None: the one rule for both
    the job keys (checkpoint.eval_temperature / eval_samples) and `appliance eval`'s flags."""
    if samples > 1 and temperature == 0.0:
        return f"{samples} greedy samples would all be the same"
    return None


class CheckpointSpec(Spec):
    every: Steps = 20
    keep_last: Int(1, limits.MAX_KEEP_LAST) = 3
    # Held-out evaluation every N steps (and at the last); null: none during training. auto: every
    # AUTO_EVAL_EVERY steps on at most AUTO_EVAL_LIMIT problems (unless eval_limit says) when best/ follows
    # held-out accuracy (best_metric unset or eval.*) and the dataset task holds problems out; else none
    # (config/best.py: evaluation_every).
    eval_every: Steps | Literal["auto"] | None = "auto"
    # Held-out problems (agent jobs: scenarios) per evaluation (the first N of the split); null: all of them
    # (an agent job: 32 scenarios; eval_every: auto during training: AUTO_EVAL_LIMIT). Also what
    # `appliance train --eval` evaluates unless --eval-limit says otherwise.
    eval_limit: Int(1, limits.MAX_DATASET_ROWS) | None = None
    # Held-out evaluation samples at this temperature; 0 is greedy. Greedy hides what sampling shows (a model
    # that is right greedily may be right in few sampled episodes): evaluate sampled to see what training moves.
    eval_temperature: Num(0.0, 2.0) = 0.0
    # Samples per held-out problem or scenario, with fixed seeds (every evaluation of the job sees the same
    # scenarios and random draws); accuracy / success is the share of all sampled completions or episodes.
    eval_samples: Int(1, 64) = 1
    # What best/ follows: null is eval.accuracy when the job evaluates during training, else reward_mean
    # (see config/best.py).
    best_metric: Line(256, min_length=1) | None = None
    # max or min; null: the metric's natural direction (min for loss and kl).
    best_mode: Literal["max", "min"] | None = None

    @model_validator(mode="after")
    def _samples_need_temperature(self) -> "CheckpointSpec":
        problem = greedy_samples_problem(self.eval_temperature, self.eval_samples)
        if problem:
            raise ValueError(f"eval_samples: {problem}; set eval_temperature above 0 (e.g. 1.0) or eval_samples: 1")
        return self


class TrackingSpec(Spec):
    """Experiment-tracker sinks for the step records; off by default, never online."""

    # TensorBoard event files in <job dir>/tensorboard/ (needs the `tensorboard` package).
    tensorboard: bool = False
    # A Weights & Biases run in offline mode in <job dir>/wandb/, uploaded later from a connected
    # machine with `wandb sync` (needs the `wandb` package).
    wandb: bool = False
    wandb_project: Line(128, min_length=1) = "appliance"


JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class JobSpec(Spec):
    name: Line(64)
    student: StudentSpec
    judge: JudgeSpec | None = None
    task: TaskSpec = TaskSpec()
    rewards: Annotated[list[RewardSpec], Field(min_length=1, max_length=limits.MAX_REWARDS)]
    grpo: GrpoSpec = GrpoSpec()
    engine: EngineSpec = EngineSpec()
    device: DeviceSpec = DeviceSpec()
    resources: ResourcesSpec = ResourcesSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    tracking: TrackingSpec = TrackingSpec()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not JOB_NAME_PATTERN.match(value):
            raise ValueError("name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    # Rules across sections that name a key (the 'judge' reward needs a 'judge' section, ...)
    # live in appliance/job_checks.py, which reports them at that key's line.
