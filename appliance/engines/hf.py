"""The transformers generation engine: the CPU path, and rollouts from the trainer's own weights.

Batched `generate` over whole groups (left padding, EOS stop), returning token ids,
text and the log-probability of each sampled token under the distribution it
was sampled from (temperature and top-p applied). Greedy when temperature is 0.
`Sampling.stop` strings end generation (transformers' stop_strings); `regex`
is not enforced here (no constrained decoding in this engine). A group's prompt
is prefilled once: its KV cache is repeated for the group's n completions, so a
batch of k prompts x n completions runs k prompt prefills, not k x n. Prompts
that share a long token prefix (an agent's system prompt and worked episodes,
or its conversation so far, at every turn of every rollout in the batch) run
that prefix once: its KV is repeated over the batch and only each prompt's own
suffix is prefilled, padded between prefix and suffix so that every row's last
prompt token lands in the last column.

`next_token_logprobs` is one forward pass over a batch of prompts with no
sampling. Prompts are right-padded (the last real token is read, and with a
causal mask the padding after it changes nothing); when the prompts share a
long token prefix (a group judged by one prompt, one id each) the prefix is run
once and its KV cache repeated over the batch.

It never changes the weights it generates through, and hands the model back in the
training mode it found it in.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (before transformers: no network lookups)

import time
from pathlib import Path

import torch

from appliance.engines.engine import Completion, EngineCounters, Sampling
from appliance.engines.scoring import shared_prefix_length, single_token_ids
from appliance.engines.step_sampler import token_processors

# Below this many shared tokens a plain batch is as fast as computing the prefix once.
MIN_SHARED_PREFIX_TOKENS = 16


# Sample from the policy itself: switch off every logits processor a model's generation_config.json
# may bring (Qwen2.5-Instruct sets repetition_penalty 1.05, top_k 20), so that the completions and
# their logprobs are those of the distribution the trainer computes. Explicit None overrides the
# model's values (transformers applies call arguments last).
POLICY_SAMPLING = {
    "top_k": None,
    "min_p": None,
    "typical_p": None,
    "top_h": None,
    "epsilon_cutoff": None,
    "eta_cutoff": None,
    "repetition_penalty": None,
    "encoder_repetition_penalty": None,
    "no_repeat_ngram_size": None,
    "encoder_no_repeat_ngram_size": None,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "min_length": 0,
    "min_new_tokens": None,
    "guidance_scale": None,
    "watermarking_config": None,
    "renormalize_logits": False,
}


def group_batches(
    prompts: list[tuple[int, str]], n: int, max_batch_size: int
) -> list[tuple[list[tuple[int, str]], int]]:
    """Generation batches of whole groups: (prompts, completions per prompt), at most max_batch_size rows each.

    A group larger than max_batch_size is split into batches of one prompt (each prefills it once).
    """
    if n <= max_batch_size:
        per_batch = max_batch_size // n
        return [(prompts[start : start + per_batch], n) for start in range(0, len(prompts), per_batch)]
    return [([entry], min(max_batch_size, n - done)) for entry in prompts for done in range(0, n, max_batch_size)]


def _contiguous_input(module, args):
    """The LM head's input made contiguous. transformers hands it the prefill's last position, a strided view
    of [rows, 1, hidden], and torch's CPU matmul expands a frozen weight per row for such an input, at a cost
    of seconds and gigabytes per batch (bench/README.md, "memory_plan.py", "shared prompts in the update")."""
    return (args[0].contiguous(),) + tuple(args[1:])


def give_head_contiguous_input(model) -> None:
    """Hook `_contiguous_input` onto the model's LM head, once however many engines generate through it."""
    head = model.get_output_embeddings()
    if head is not None and not getattr(head, "_appliance_contiguous_input", False):
        head.register_forward_pre_hook(_contiguous_input)
        # Marked on the module: the evaluation builds a new engine over the student at every run.
        head._appliance_contiguous_input = True


class HFEngine:
    """Generates with any transformers causal LM (plain, bitsandbytes-quantized or peft-wrapped)."""

    kind = "hf"
    samples_like_trainer = True

    def __init__(self, model, tokenizer, name: str, max_batch_size: int = 64, owns_weights: bool = False):
        self.model = model
        # An engine that loaded its own weights (a judge, the merged rollout copy) may move them to host RAM
        # while asleep; one generating through the trainer's model (owns_weights False) never moves them.
        self.owns_weights = owns_weights
        self._asleep_from: torch.device | None = None
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch_size = max_batch_size
        self.counters = EngineCounters()
        self.adapter_version: int | None = None
        self._stop_ids = self._eos_ids()
        give_head_contiguous_input(model)

    @classmethod
    def load(
        cls,
        model_dir: Path,
        quantization: str = "none",
        compute_dtype: torch.dtype | None = None,
        device: str | None = None,
        name: str | None = None,
        max_batch_size: int = 64,
    ) -> "HFEngine":
        from appliance.models.causal_lm import default_device, load_causal_lm, load_tokenizer

        device = device or default_device()
        dtype = compute_dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        model = load_causal_lm(model_dir, quantization, dtype, device)
        return cls(model, load_tokenizer(model_dir), name or Path(model_dir).name, max_batch_size, owns_weights=True)

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(configured)
        return sorted(i for i in ids if i is not None)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling: Sampling) -> list[list[Completion]]:
        self.wake()
        started = time.monotonic()
        if sampling.seed is not None:
            # The draws come from torch's global generator (step_sampler.draw), so seeding it repeats them.
            torch.manual_seed(sampling.seed)
        results: list[list[Completion]] = [[] for _ in prompts]
        # eval() for generation (no dropout), restored after: the trainer's model may be in training mode.
        was_training = self.model.training
        self.model.eval()
        try:
            for batch, copies in group_batches(list(enumerate(prompts)), sampling.n, self.max_batch_size):
                for completion in self._generate_batch(batch, copies, sampling):
                    results[completion.prompt_index].append(completion)
        finally:
            self.model.train(was_training)
        self.counters.generate_seconds += time.monotonic() - started
        self.counters.calls += 1
        return results

    def _encode_batch(self, prompts: list[str]) -> tuple[dict[str, torch.Tensor], int]:
        """The prompts as one batch: ids and mask [rows, width], and how many leading tokens all rows share.

        Rows are laid out as shared prefix, padding, own suffix: the padding sits between the two, so the
        prefix occupies the same columns in every row and each row's last prompt token is in the last
        column, where generate() continues. Without a shared prefix this is plain left padding.
        """
        # The prompts are rendered chat text that already holds any BOS the template writes.
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        shared = shared_prefix_length(ids) if len(ids) > 1 else 0
        if shared < MIN_SHARED_PREFIX_TOKENS:
            shared = 0
        width = max(len(row) for row in ids)
        # Some tokenizers have no pad token; any id does, since the mask hides it.
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = [row[:shared] + [pad] * (width - len(row)) + row[shared:] for row in ids]
        mask = [[1] * shared + [0] * (width - len(row)) + [1] * (len(row) - shared) for row in ids]
        encoded = {"input_ids": torch.tensor(input_ids), "attention_mask": torch.tensor(mask)}
        return {key: value.to(self.device) for key, value in encoded.items()}, shared

    def _prefill(self, encoded, shared: int, copies: int):
        """The prompts' KV (all but the last token), each piece computed once, repeated for `copies` completions.

        The shared prefix runs once for the whole batch, each row's own suffix once for its `copies`
        completions; generate() then runs only each row's last prompt token before sampling. None when
        there is nothing to share (one completion per prompt and no shared prefix, or one-token prompts):
        generate prefills as usual.
        """
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        # generate() must still run each row's last prompt token itself, so a one-token prompt has nothing to
        # prefill here.
        if (copies < 2 and not shared) or ids.shape[1] < 2:
            return None
        # The position ids generate() derives from the mask (_prepare_position_ids_for_generation).
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        past = None
        if shared:
            # One row's prefix: every row holds the same tokens in the same columns. logits_to_keep=1: only the
            # cache is wanted, so the head runs on one position.
            past = self.model(input_ids=ids[:1, :shared], use_cache=True, logits_to_keep=1).past_key_values
            past.batch_repeat_interleave(ids.shape[0])
        if ids.shape[1] - 1 > shared:
            past = self.model(
                input_ids=ids[:, shared:-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, shared:-1],
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
            ).past_key_values
        if copies > 1:
            past.batch_repeat_interleave(copies)
        return past

    def _generate_batch(self, batch: list[tuple[int, str]], copies: int, sampling: Sampling) -> list[Completion]:
        encoded, shared = self._encode_batch([prompt for _, prompt in batch])
        past = self._prefill(encoded, shared, copies)
        # Each prompt's copies sit next to each other, in the order the cache was repeated in.
        encoded = {key: value.repeat_interleave(copies, dim=0) for key, value in encoded.items()}
        rows = [entry for entry in batch for _ in range(copies)]
        # Our last processor picks each token and keeps its logprob (step_sampler.py); generate() appends it.
        processors, sampler = token_processors(sampling.temperature, sampling.top_p)
        output = self.model.generate(
            **encoded,
            past_key_values=past,
            max_new_tokens=sampling.max_new_tokens,
            # Greedy over what StepSampler returns: the sampler has already drawn the token. The model's own
            # temperature and top_p are cleared, since the processors above apply ours.
            do_sample=False,
            temperature=None,
            top_p=None,
            logits_processor=processors,
            eos_token_id=self._stop_ids,
            **POLICY_SAMPLING,
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True,
            **({"stop_strings": list(sampling.stop), "tokenizer": self.tokenizer} if sampling.stop else {}),
        )
        prompt_width = encoded["input_ids"].shape[1]
        generated = output.sequences[:, prompt_width:]
        chosen = sampler.logprobs(len(rows))
        return [
            self._completion(prompt_index, encoded, generated, chosen, row)
            for row, (prompt_index, _) in enumerate(rows)
        ]

    def _completion(self, prompt_index: int, encoded, generated, chosen, row: int) -> Completion:
        tokens = generated[row].tolist()
        length, finish = len(tokens), "length"
        # generate pads finished rows after their stop token; the completion ends at the first stop, kept.
        for position, token in enumerate(tokens):
            if token in self._stop_ids:
                length, finish = position + 1, "stop"
                break
        tokens = tokens[:length]
        prompt_ids = encoded["input_ids"][row][encoded["attention_mask"][row].bool()].tolist()
        self.counters.prompt_tokens += len(prompt_ids)
        self.counters.generated_tokens += len(tokens)
        return Completion(
            prompt_index=prompt_index,
            prompt_token_ids=prompt_ids,
            token_ids=tokens,
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            logprobs=chosen[row, :length].tolist(),
            finish_reason=finish,
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def next_token_logprobs(self, prompts: list[str], candidates: list[str]) -> list[dict[str, float]]:
        if not prompts:
            return []
        self.wake()
        started = time.monotonic()
        # Every prompt is scored over the same candidate ids, tokenized in the context of the first prompt.
        candidate_ids = torch.tensor(single_token_ids(self._encode, prompts[0], candidates), device=self.device)
        encoded = [self._encode(prompt) for prompt in prompts]
        results: list[dict[str, float]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(encoded), self.max_batch_size):
                logprobs = self._last_logprobs(encoded[start : start + self.max_batch_size])
                chosen = logprobs[:, candidate_ids].tolist()
                results.extend(dict(zip(candidates, row)) for row in chosen)
        finally:
            self.model.train(was_training)
        self.counters.prompt_tokens += sum(len(ids) for ids in encoded)
        self.counters.generate_seconds += time.monotonic() - started
        self.counters.calls += 1
        return results

    def _last_logprobs(self, batch: list[list[int]]) -> torch.Tensor:
        """log_softmax of the logits after each sequence's last token: [len(batch), vocab]."""
        shared = shared_prefix_length(batch) if len(batch) > 1 else 0
        past = None
        if shared >= MIN_SHARED_PREFIX_TOKENS:
            prefix = torch.tensor([batch[0][:shared]], device=self.device)
            past = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
            past.batch_repeat_interleave(len(batch))
        else:
            shared = 0
        # Right padding: the last real token is read, and under a causal mask the padding after it changes nothing.
        suffixes = [ids[shared:] for ids in batch]
        width = max(len(ids) for ids in suffixes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in suffixes], device=self.device)
        # Only the rows' last positions go through the LM head (a fifth of the model's compute at this size).
        positions = sorted({len(ids) - 1 for ids in suffixes})
        logits = self.model(
            input_ids=input_ids,
            past_key_values=past,
            use_cache=past is not None,
            logits_to_keep=torch.tensor(positions, device=self.device),
        ).logits
        column = torch.tensor([positions.index(len(ids) - 1) for ids in suffixes], device=self.device)
        return torch.log_softmax(logits[torch.arange(len(batch), device=self.device), column].float(), dim=-1)

    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        """The shared-weights engine already sees the trainer's adapter; only the version moves."""
        self.adapter_version = version

    def sleep(self) -> None:
        """On CUDA: weights it owns go to host RAM (the plan's time-sharing counts them out) and the cache is freed.

        On the CPU host RAM is the device: nothing to move, nothing to free.
        """
        if self._asleep_from is not None or self.device.type != "cuda":
            return
        if self.owns_weights:
            self._asleep_from = self.device
            self.model.to("cpu")
        torch.cuda.empty_cache()

    def wake(self) -> None:
        """Weights back on the device they slept from; generate() and the scorers call it themselves."""
        if self._asleep_from is not None:
            self.model.to(self._asleep_from)
            self._asleep_from = None

    def metrics_snapshot(self) -> dict | None:
        return None  # transformers keeps no metrics of its own; the counters are in the StepRecord

    def close(self) -> None:
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
