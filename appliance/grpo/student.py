"""The student: a bitsandbytes 4-bit (or unquantized) base with a peft LoRA adapter.

The reference policy for the KL term is the same model with the adapter
disabled, so no second copy of the weights is held. The model rests in eval
mode (generation shares these weights); only the gradient pass runs in
training mode, where LoRA dropout applies and transformers' gradient
checkpointing recomputes each layer (it is a no-op on layers in eval mode). Log-probabilities are
computed only at completion positions and never as a whole logits tensor (batch x positions x
vocab x 4 bytes, the largest in the step): the decoder's last hidden states go through the LM
head a chunk at a time (`chunked_token_logprobs`), and SwiGLU MLPs keep two of their three
intermediates for backward (`keep_gate_and_up_only`).
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import types
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from appliance.budget.components import logit_chunk_bytes, logit_chunk_tokens, packs_prompts, shares_prompts
from appliance.config.schema import StudentSpec
from appliance.grpo.distributed import RankInfo
from appliance.grpo.fsdp import load_sharded_causal_lm
from appliance.models.causal_lm import load_causal_lm, load_tokenizer, resolve_compute_dtype


@dataclass
class TokenBatch:
    """Prompts left-padded and completions right-padded into one rectangle."""

    input_ids: torch.Tensor  # [N, P + C]
    attention_mask: torch.Tensor  # [N, P + C]
    completion_ids: torch.Tensor  # [N, C]
    completion_mask: torch.Tensor  # [N, C] 1 on trained completion tokens


def pack_batch(
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    train_masks: list[list[int] | None] | None = None,
) -> TokenBatch:
    """train_masks: per completion, 1 on the tokens to train (an agent trajectory's assistant tokens) and 0 on
    context inside the completion (tool results, template glue); None trains every completion token."""
    prompt_width = max(len(p) for p in prompts)
    completion_width = max(1, max(len(c) for c in completions))
    rows, masks, targets, target_masks = [], [], [], []
    for index, (prompt, completion) in enumerate(zip(prompts, completions)):
        left = prompt_width - len(prompt)
        right = completion_width - len(completion)
        trained = train_masks[index] if train_masks is not None else None
        if trained is not None and len(trained) != len(completion):
            raise ValueError(f"train mask {index} has {len(trained)} entries for {len(completion)} completion tokens")
        rows.append([pad_id] * left + prompt + completion + [pad_id] * right)
        masks.append([0] * left + [1] * (len(prompt) + len(completion)) + [0] * right)
        targets.append(completion + [pad_id] * right)
        target_masks.append((list(trained) if trained is not None else [1] * len(completion)) + [0] * right)
    return TokenBatch(torch.tensor(rows), torch.tensor(masks), torch.tensor(targets), torch.tensor(target_masks))


def plain_head(causal_lm) -> torch.nn.Linear | None:
    """The LM head when logits are exactly head(hidden) (no LoRA or 4-bit head, no soft-capping or scaling)."""
    head = causal_lm.get_output_embeddings()
    config = causal_lm.config
    scaled = getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
    return head if type(head) is torch.nn.Linear and not scaled else None


def _shared_prompt_hidden(decoder, inputs: dict, width: int, first_row: torch.Tensor, row_prompt: torch.Tensor):
    """The last hidden states before each of `width` completion tokens, each distinct prompt run once.

    The prompt rows run first (with grad where the caller has it); their KV cache is then indexed out to every
    row sharing the prompt, and the completions run on it. Autograd sums each row's gradient back into its
    prompt's keys and values, so values and gradients equal the whole batch's, with the prompt tokens' work
    done once per group instead of once per completion.
    """
    prompt_width = inputs["input_ids"].shape[1] - width
    prompt_rows = first_row.to(inputs["input_ids"].device)
    prompt_out = decoder(
        input_ids=inputs["input_ids"][prompt_rows, :prompt_width],
        attention_mask=inputs["attention_mask"][prompt_rows, :prompt_width],
        position_ids=inputs["position_ids"][prompt_rows, :prompt_width],
        use_cache=True,
    )
    cache = prompt_out.past_key_values
    row_prompt = row_prompt.to(prompt_rows.device)
    cache.batch_select_indices(row_prompt)
    completion_out = decoder(
        input_ids=inputs["input_ids"][:, prompt_width:],
        attention_mask=inputs["attention_mask"],
        position_ids=inputs["position_ids"][:, prompt_width:],
        past_key_values=cache,
        use_cache=True,
    )
    before_first = prompt_out.last_hidden_state[row_prompt, -1:, :]
    return torch.cat([before_first, completion_out.last_hidden_state[:, :-1, :]], dim=1)


def _packed_prompt_hidden(decoder, inputs: dict, width: int, first_row: torch.Tensor, row_prompt: torch.Tensor):
    """What `_shared_prompt_hidden` returns, in one decoder pass: each distinct prompt and its rows' completions
    packed into one sequence, [prompt | completion 1 | completion 2 | ...], whose mask lets every completion
    see its prompt and itself only, at the positions it has in its own row.

    One pass instead of two halves the per-pass work of a small micro-batch (every layer's 4-bit weights
    dequantized in forward and backward, and each op's dispatch; bench/README.md, "Packed prompts"). Its
    attention spans the packed sequence, so the caller packs only short ones (budget.components.packs_prompts).
    """
    ids, mask, positions = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    prompt_width = ids.shape[1] - width
    device = ids.device
    sequences, sequence_positions, segments, keys = [], [], [], []
    gather = torch.empty(ids.shape[0], width, dtype=torch.long)
    for prompt, row in enumerate(first_row.tolist()):
        real = mask[row, :prompt_width].bool()
        rows = torch.nonzero(row_prompt == prompt).flatten().tolist()
        prompt_tokens = int(real.sum())
        sequences.append(torch.cat([ids[row, :prompt_width][real], ids[rows, prompt_width:].reshape(-1)]))
        sequence_positions.append(
            torch.cat([positions[row, :prompt_width][real], positions[rows, prompt_width:].reshape(-1)])
        )
        keys.append(torch.cat([real[real], mask[rows, prompt_width:].reshape(-1).bool()]).cpu())
        segments.append(
            torch.arange(len(rows) + 1).repeat_interleave(torch.tensor([prompt_tokens] + [width] * len(rows)))
        )
        for index, member in enumerate(rows):
            start = prompt_tokens + index * width  # this row's first completion token in the packed sequence
            gather[member, 0] = prompt_tokens - 1
            gather[member, 1:] = torch.arange(start, start + width - 1)
    length = max(len(sequence) for sequence in sequences)
    packed_ids = torch.stack([F.pad(sequence, (0, length - len(sequence))) for sequence in sequences])
    packed_positions = torch.stack([F.pad(p, (0, length - len(p))) for p in sequence_positions])
    # A completion's padding, like the padding at a packed sequence's end (a segment of its own, -1), is no
    # one's key, as under the rows' own mask; as a query it sees its prompt, so no row of the mask is empty.
    segment = torch.stack([F.pad(s, (0, length - len(s)), value=-1) for s in segments])
    is_key = torch.stack([F.pad(k, (0, length - len(k))) for k in keys])[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same = segment[:, :, None] == segment[:, None, :]
    sees_prompt = (segment == 0)[:, None, :]
    attend = (causal & (same | sees_prompt) & is_key)[:, None, :, :]
    hidden = decoder(
        input_ids=packed_ids.to(device),
        attention_mask=attend.to(device),
        position_ids=packed_positions.to(device),
        use_cache=False,
    ).last_hidden_state
    flat = gather + row_prompt[:, None].cpu() * length
    return hidden.reshape(-1, hidden.shape[-1])[flat.to(device)]


class Student:
    """Owns the trainable model; knows nothing of rewards, engines or the daemon."""

    def __init__(
        self,
        spec: StudentSpec,
        model_dir: Path,
        device: str,
        gradient_checkpointing: bool = False,
        shardable: bool = False,
        shard_over: RankInfo | None = None,
    ):
        """shardable: 4-bit weights in compute-dtype storage, as a sharded base holds them (the same bits).
        shard_over: the world whose ranks each load and keep a shard of the base (grpo/fsdp.py)."""
        from peft import LoraConfig, get_peft_model

        self.spec = spec
        self.device = device
        self.shardable = shardable or shard_over is not None
        self.compute_dtype = resolve_compute_dtype(spec.compute_dtype, device)
        self.tokenizer = load_tokenizer(model_dir)
        if shard_over is not None:
            base = load_sharded_causal_lm(model_dir, spec.quantization, self.compute_dtype, shard_over)
        else:
            base = load_causal_lm(model_dir, spec.quantization, self.compute_dtype, device, shardable)
        if gradient_checkpointing:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            base.enable_input_require_grads()
        self.gradient_checkpointing = gradient_checkpointing
        lora = LoraConfig(
            r=spec.lora.rank,
            lora_alpha=spec.lora.alpha,
            lora_dropout=spec.lora.dropout,
            target_modules=list(spec.lora.target_modules),
            task_type="CAUSAL_LM",
        )
        self.model = get_peft_model(base, lora)
        keep_gate_and_up_only(self.model)
        self.model.eval()
        # LoRA parameters train in fp32 whatever the compute dtype: updates are tiny.
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.float()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def completion_logprobs(
        self, batch: TokenBatch, temperature: float, reference: bool = False, train: bool = False
    ) -> torch.Tensor:
        """log p(completion token) under the student at `temperature`: [N, C].

        train=True: the gradient pass, in training mode (dropout on, checkpointing
        active); otherwise eval mode, as for old and reference logprobs.
        reference=True evaluates the base model (adapter disabled) without gradients.
        """
        if train and not reference:
            self.model.train()
            try:
                return self._logprobs(batch, temperature, reference=False)
            finally:
                self.model.eval()
        return self._logprobs(batch, temperature, reference)

    def _logprobs(self, batch: TokenBatch, temperature: float, reference: bool) -> torch.Tensor:
        batch_device = {k: getattr(batch, k).to(self.device) for k in ("input_ids", "attention_mask", "completion_ids")}
        inputs = {
            "input_ids": batch_device["input_ids"],
            "attention_mask": batch_device["attention_mask"],
            "position_ids": (batch_device["attention_mask"].cumsum(-1) - 1).clamp(min=0),
            "use_cache": False,
        }
        width = batch.completion_ids.shape[1]
        targets = batch_device["completion_ids"]
        causal_lm = self.model.get_base_model()
        head = plain_head(causal_lm)
        context = self.model.disable_adapter() if reference else nullcontext()
        grad = torch.no_grad() if reference else nullcontext()
        with context, grad:
            if head is None:
                logits = self.model(**inputs, logits_to_keep=width + 1).logits[:, :-1, :]
                return plain_token_logprobs(logits, targets, temperature)
            groups = self._prompt_groups(batch)
            if groups is None:
                hidden = causal_lm.get_decoder()(**inputs).last_hidden_state[:, -(width + 1) : -1, :]
            elif self._packs(batch, groups[1]):
                hidden = _packed_prompt_hidden(causal_lm.get_decoder(), inputs, width, *groups)
            else:
                hidden = _shared_prompt_hidden(causal_lm.get_decoder(), inputs, width, *groups)
            return chunked_token_logprobs(hidden, head, targets, temperature)

    def _prompt_groups(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(a row holding each distinct prompt, each row's prompt among those), or None: the batch runs whole.

        Whole: when too few rows share a prompt (budget.components.shares_prompts, the rule the planner
        counts by); under gradient checkpointing in training mode (transformers drops a cache there); and for a
        base FSDP shards, whose ranks must run the same forward calls.
        """
        if self.shardable or (self.gradient_checkpointing and self.model.training):
            return None
        prompt_width = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
        if prompt_width == 0:
            return None
        keys = torch.cat([batch.input_ids[:, :prompt_width], batch.attention_mask[:, :prompt_width]], dim=1)
        distinct, row_prompt = torch.unique(keys, dim=0, return_inverse=True)
        if not shares_prompts(len(distinct), len(keys)):
            return None
        rows = torch.arange(len(keys))
        first_row = torch.full((len(distinct),), len(keys)).scatter_reduce(0, row_prompt, rows, reduce="amin")
        return first_row, row_prompt

    def _packs(self, batch: TokenBatch, row_prompt: torch.Tensor) -> bool:
        """Whether the shared prompts run packed with their completions (_packed_prompt_hidden): short enough
        (budget.components.packs_prompts, the planner's rule), under SDPA (which takes the packed sequence's
        boolean mask as it is), and within any sliding window (a custom mask replaces the model's window)."""
        config = self.model.get_base_model().config
        window = getattr(config, "sliding_window", None)
        if config._attn_implementation != "sdpa" or (window and batch.input_ids.shape[1] > window):
            return False
        prompt_width = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
        rows_per_prompt = int(torch.bincount(row_prompt).max())
        return packs_prompts(prompt_width, batch.completion_ids.shape[1], rows_per_prompt)

    def save_adapter(self, folder: Path) -> None:
        self.model.save_pretrained(str(folder))

    def load_adapter(self, folder: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        from appliance.errors import CheckpointError

        state = load_file(str(Path(folder) / "adapter_model.safetensors"), device=str(self.device))
        result = set_peft_model_state_dict(self.model, state)
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(
                f"adapter in {folder} does not match this student: unexpected {result.unexpected_keys[:3]}"
            )


# ----- a SwiGLU MLP that keeps two of its three intermediates for backward ---------------------------------
# `down(silu(gate(x)) * up(x))` under plain autograd saves gate(x) for silu's backward and both factors of the
# product for the mul's: three [tokens x intermediate] tensors a layer, the largest part of what a decoder layer
# keeps. silu(gate) is cheap to rebuild from gate, so `_SiluGate` saves gate and up only and recomputes it in
# backward with the kernels plain autograd would run: values and gradients stay bit for bit the plain model's
# (tests/grpo/test_swiglu.py), and the planner counts two intermediates (budget/components.py).


class _SiluGate(torch.autograd.Function):
    """silu(gate) * up, saving gate and up only."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # The kernels plain autograd runs (mul's backward, then aten's silu_backward) on the same tensors.
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def silu_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up; under autograd through `_SiluGate`."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluGate.apply(gate, up)
    return F.silu(gate) * up


def _lean_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_gate(self.gate_proj(x), self.up_proj(x)))


def is_silu_gated_mlp(module: torch.nn.Module) -> bool:
    """A transformers SwiGLU MLP (Llama, Qwen2, Mistral, SmolLM): gate, up and down projections and a SiLU."""
    act = getattr(module, "act_fn", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return silu and all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj"))


def keep_gate_and_up_only(model: torch.nn.Module) -> int:
    """Run every SwiGLU MLP of `model` through `_SiluGate`; returns how many were changed."""
    changed = 0
    for module in model.modules():
        if is_silu_gated_mlp(module):
            module.forward = types.MethodType(_lean_forward, module)
            changed += 1
    return changed


# ----- log-probabilities of the sampled tokens without the full-vocabulary logits tensor -------------------
# The last hidden states go through the LM head a chunk of tokens at a time; each chunk's logits are reduced to
# the sampled token's logprob at once and dropped. Backward recomputes each chunk's logits (softmax - one-hot,
# times the head), so autograd never holds more than one chunk of [tokens x vocab] either.

# fp32 logits per chunk; None: the size for the hidden states' device, which the planner counts
# (budget/components.py logprob_bytes). Tests pin a small one.
CHUNK_LOGIT_BYTES: int | None = None


def _upcast(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit tensors (as the trainer's .float()), float64 kept."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    # The same operations, in the same dtypes, as model.lm_head(hidden).float() / temperature.
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return logits.to(_upcast(logits.dtype)) / temperature


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """hidden [T, H], weight [V, H], bias [V] or None, targets [T] -> logp [T] (fp32)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, rows: int):
        out = torch.empty(hidden.shape[0], dtype=_upcast(hidden.dtype), device=hidden.device)
        for start in range(0, hidden.shape[0], rows):
            logits = _chunk_logits(hidden[start : start + rows], weight, bias, temperature)
            chosen = logits.gather(1, targets[start : start + rows, None]).squeeze(1)
            out[start : start + rows] = chosen - torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        wide = _upcast(weight.dtype)
        grad_weight = torch.zeros_like(weight, dtype=wide) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=wide) if need_bias else None
        for start in range(0, hidden.shape[0], ctx.rows):
            chunk = hidden[start : start + ctx.rows]
            upstream = grad_out[start : start + ctx.rows].to(_upcast(grad_out.dtype))
            # d logp_t / d logits_t = onehot(target_t) - softmax(logits_t)
            grad_logits = torch.softmax(_chunk_logits(chunk, weight, bias, ctx.temperature), dim=-1)
            grad_logits.mul_(-upstream[:, None])
            grad_logits.scatter_add_(1, targets[start : start + ctx.rows, None], upstream[:, None])
            grad_logits = (grad_logits / ctx.temperature).to(hidden.dtype)
            if need_hidden:
                grad_hidden[start : start + ctx.rows] = grad_logits @ weight
            if need_weight:
                grad_weight += grad_logits.to(wide).T @ chunk.to(wide)
            if need_bias:
                grad_bias += grad_logits.to(wide).sum(0)
        grad_weight = grad_weight.to(weight.dtype) if need_weight else None
        grad_bias = grad_bias.to(bias.dtype) if need_bias else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """log softmax(head(hidden) / temperature)[targets] for hidden [N, C, H], targets [N, C]: [N, C] (fp32 or wider).

    chunk_bytes: fp32 logits per chunk (default: CHUNK_LOGIT_BYTES, else the size for hidden's device).
    """
    batch, width, size = hidden.shape
    flat = hidden.reshape(batch * width, size)
    rows = logit_chunk_tokens(
        head.out_features, chunk_bytes or CHUNK_LOGIT_BYTES or logit_chunk_bytes(hidden.device.type)
    )
    logp = _ChunkedTokenLogprobs.apply(flat, head.weight, head.bias, targets.reshape(-1), float(temperature), rows)
    return logp.view(batch, width)


def plain_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The same from materialised logits [N, C, V] (models whose head is not a plain linear layer)."""
    logits = logits.to(_upcast(logits.dtype)) / temperature
    chosen = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
