"""One optimizer step of GRPO on a scored rollout: micro-batches, loss, backward, clip, step; the optimizer,
its schedule, and what an out-of-memory retry needs (a smaller micro-batch, an undo of applied updates).

A sample is a prompt and a completion; a multi-turn trajectory is one too (its
completion is everything from the first assistant token on) with a train mask
that keeps tool results and template glue out of the loss, so single-turn and
agent jobs share this one loss. Only completions of informative groups reach this module (groups whose
rewards were all equal carry zero advantage and were dropped by the caller).
With `iterations` > 1 the same rollout is reused; the ratio is then taken
against logprobs stored before the first update (old policy). A NaN or inf
loss or gradient norm skips the optimizer step (`UpdateStats.nonfinite`).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass

import torch

from appliance.budget.memory_ledger import Ledger
from appliance.config.schema import GrpoSpec
from appliance.errors import ApplianceError
from appliance.grpo.loss import StepNormalizer, policy_loss
from appliance.grpo.student import Student, TokenBatch, pack_batch


@dataclass
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    # Logprobs from the engine that sampled it (vLLM): enables truncated importance sampling.
    # One per completion token; context positions of a trajectory hold 0.0 (they are masked out).
    engine_logprobs: list[float] | None = None
    # Multi-turn trajectories: 1 on completion tokens to train (assistant turns), 0 on context inside the
    # completion (tool results, template glue). None: every completion token is trained (single turn).
    train_mask: list[int] | None = None

    @property
    def trained_tokens(self) -> int:
        return len(self.completion_ids) if self.train_mask is None else sum(self.train_mask)


@dataclass
class UpdateStats:
    loss: float = 0.0
    kl: float = 0.0
    clip_ratio: float = 0.0
    grad_norm: float = 0.0
    micro_batches: int = 0
    sequences: int = 0
    tokens: int = 0
    logprob_diff_mean: float = 0.0  # |trainer - engine| on sampled tokens, when the engine differs
    logprob_diff_max: float = 0.0
    nonfinite: bool = False  # a NaN/inf loss or gradient norm: the optimizer step was skipped


def padding_sample(pad_id: int) -> TrainSample:
    """A one-token sample with nothing to train: its loss and gradient are zero."""
    return TrainSample([pad_id], [pad_id], advantage=0.0, train_mask=[0])


def _chunks(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _batch(student: Student, samples: list[TrainSample]) -> TokenBatch:
    return pack_batch(
        [s.prompt_ids for s in samples],
        [s.completion_ids for s in samples],
        student.pad_id,
        [s.train_mask for s in samples],
    )


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([row + [0.0] * (width - len(row)) for row in rows], dtype=torch.float32)


@dataclass
class MicroBatch:
    """One micro-batch with what is fixed before the first update: old logprobs and importance weights."""

    samples: list[TrainSample]
    batch: TokenBatch
    old_logprobs: torch.Tensor | None  # None: the ratio is taken against the detached current logprobs
    importance_weights: torch.Tensor | None  # min(exp(old - engine), cap); None without engine logprobs
    # The engine's logprobs (the old ones where a row has none) when the weights come from the gradient pass.
    engine_logprobs: torch.Tensor | None = None


class GrpoUpdater:
    """Applies GRPO updates to a student; holds no state besides the optimizer it is given.

    `applied_steps` counts the optimizer steps the current (or last) call of
    `step()` applied, so a caller retrying after an error knows whether the
    adapter already moved.
    """

    def __init__(
        self,
        student: Student,
        optimizer,
        scheduler,
        spec: GrpoSpec,
        importance_sampling_cap: float = 2.0,
        reducer=None,
    ):
        self.student = student
        # Data-parallel ranks: a grpo.distributed.GradientReducer summing counts and gradients over ranks.
        self.reducer = reducer
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.spec = spec
        self.importance_sampling_cap = importance_sampling_cap
        self.applied_steps = 0

    def prepare(
        self, samples: list[TrainSample], micro_batch_size: int, padding: int = 0, old_everywhere: bool = False
    ) -> tuple[list[MicroBatch], list[torch.Tensor]]:
        """Micro-batches with old logprobs (eval mode, before any update) and truncated importance weights.

        As in TRL, the importance weight of an engine rollout compares the
        engine's logprobs with the policy that sampled (the old policy), once:
        later iterations' drift stays in the GRPO ratio, not in the weight.
        With one iteration the policy before the update is the one the gradient pass computes, so the weights
        come from that pass (`_micro_step`) and no separate forward runs (LoRA dropout, off by default, makes
        them a noisy estimate of the same): TRL runs one.
        `padding` appends micro-batches that train nothing and `old_everywhere` takes old logprobs of every
        micro-batch: a sharded base needs the same passes on every rank (see `_lockstep`).
        """
        prepared, diffs = [], []
        chunks = _chunks(samples, micro_batch_size) + [[padding_sample(self.student.pad_id)]] * padding
        for chunk in chunks:
            batch = _batch(self.student, chunk)
            has_engine = any(s.engine_logprobs is not None for s in chunk)
            old = weights = engine_logp = None
            if self.spec.iterations > 1 or old_everywhere:
                with torch.no_grad():
                    old = self.student.completion_logprobs(batch, self.spec.temperature).detach()
            if has_engine:
                engine_logp = self._engine_logprobs(chunk, batch.completion_ids.shape[1])
                if old is not None:
                    weights, diff = self._importance(old, engine_logp, batch)
                    diffs.append(diff)
                    engine_logp = None
            prepared.append(MicroBatch(chunk, batch, old if self.spec.iterations > 1 else None, weights, engine_logp))
        return prepared, diffs

    @staticmethod
    def _engine_logprobs(chunk: list[TrainSample], width: int) -> torch.Tensor:
        """[rows, width] engine logprobs; NaN on the rows without (on-policy rows of a mixed batch)."""
        rows = [s.engine_logprobs if s.engine_logprobs is not None else [math.nan] * width for s in chunk]
        return _padded(rows, width)

    def _importance(self, old: torch.Tensor, engine_logp: torch.Tensor, batch: TokenBatch):
        """(truncated importance weights, |old - engine| on trained tokens) for one micro-batch.

        Rows without engine logprobs take the old ones: weight 1.
        """
        from appliance.engines.importance import truncated_importance_weights

        engine_logp = engine_logp.to(old.device)
        engine_logp = torch.where(torch.isnan(engine_logp), old, engine_logp)
        mask = batch.completion_mask.to(old.device).float()
        weights, _ = truncated_importance_weights(old, engine_logp, mask, self.importance_sampling_cap)
        return weights, (old - engine_logp).abs()[mask.bool()]

    def step(self, samples: list[TrainSample], micro_batch_size: int) -> UpdateStats:
        self.applied_steps = 0
        stats = UpdateStats(sequences=len(samples), tokens=sum(s.trained_tokens for s in samples))
        if not samples and self.reducer is None:
            return stats
        real = len(_chunks(samples, micro_batch_size))
        counts = (len(samples), stats.tokens, real)
        if self.reducer is not None:  # every rank divides by the whole step's counts (a rank may hold none)
            counts = self.reducer.counts(*counts)
            if counts[0] == 0:
                return stats
        padding, old_everywhere = self._lockstep(samples, real)
        micro_batches, diffs = self.prepare(samples, micro_batch_size, padding, old_everywhere)
        normalizer = StepNormalizer(*counts, self.spec.max_new_tokens)
        parameters = self.student.trainable_parameters()
        iterations = 0
        for _ in range(self.spec.iterations):
            self.optimizer.zero_grad(set_to_none=True)
            loss = kl = clip = 0.0
            for index, micro in enumerate(micro_batches):
                output = self._micro_step(micro, normalizer, diffs)
                if index >= real:
                    continue  # padding: no loss, no gradient, not in the step's figures
                loss += float(output.loss.detach())
                kl += output.kl_mean
                clip += output.clip_ratio
                stats.micro_batches += 1
            if self.reducer is not None:
                self.reducer.gradients(parameters)
                loss, kl, clip = self.reducer.totals(loss, kl, clip)  # every rank's micro-batches
            kl, clip = kl / counts[2], clip / counts[2]  # means over the step's micro-batches (counts: every rank's)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, self.spec.max_grad_norm))
            stats.loss, stats.kl, stats.clip_ratio, stats.grad_norm = (
                stats.loss + loss,
                stats.kl + kl,
                stats.clip_ratio + clip,
                grad_norm,
            )
            iterations += 1
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                # Skip this update (and the rollout's later iterations): the adapter keeps its finite values.
                stats.nonfinite = True
                break
            self.optimizer.step()
            self.applied_steps += 1
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats.loss /= iterations
        stats.kl /= iterations
        stats.clip_ratio /= iterations
        stats.logprob_diff_mean, stats.logprob_diff_max = self._logprob_diffs(diffs)
        return stats

    def _logprob_diffs(self, diffs: list[torch.Tensor]) -> tuple[float, float]:
        """|trainer - engine| on the step's sampled tokens: the mean and max over every rank's (0, 0 without)."""
        joined = torch.cat(diffs).double() if diffs else torch.zeros(0, dtype=torch.float64)
        total, count = float(joined.sum()), float(joined.numel())
        largest = float(joined.max()) if joined.numel() else 0.0
        if self.reducer is not None:  # every rank reaches this, with or without engine logprobs of its own
            total, count = self.reducer.totals(total, count)
            largest = self.reducer.largest(largest)
        return (total / count, largest) if count else (0.0, 0.0)

    def _lockstep(self, samples: list[TrainSample], real: int) -> tuple[int, bool]:
        """(padding micro-batches, old logprobs everywhere) so every rank runs the same forward passes.

        Only for a base sharded with FSDP, where every forward is a collective: a rank that
        dropped more zero-advantage groups pads up to the busiest rank's count.
        """
        if self.reducer is None or not self.reducer.lockstep:
            return 0, False
        has_engine = any(s.engine_logprobs is not None for s in samples)
        return self.reducer.maximum(real) - real, self.reducer.anywhere(has_engine)

    def _micro_step(self, micro: MicroBatch, normalizer: StepNormalizer, diffs: list[torch.Tensor]):
        logp = self.student.completion_logprobs(micro.batch, self.spec.temperature, train=True)
        if micro.engine_logprobs is not None:  # one iteration: this pass's logprobs are the old policy's
            micro.importance_weights, diff = self._importance(logp.detach(), micro.engine_logprobs, micro.batch)
            micro.engine_logprobs = None
            diffs.append(diff)
        mask = micro.batch.completion_mask.to(logp.device).float()
        advantages = torch.tensor([s.advantage for s in micro.samples], dtype=torch.float32, device=logp.device)
        ref_logp = None
        if self.spec.beta > 0:
            ref_logp = self.student.completion_logprobs(micro.batch, self.spec.temperature, reference=True)
        old = logp.detach() if micro.old_logprobs is None else micro.old_logprobs
        output = policy_loss(
            logp,
            old,
            advantages,
            mask,
            self.spec.loss,
            normalizer,
            self.spec.epsilon,
            self.spec.epsilon_high,
            self.spec.beta,
            ref_logp,
            micro.importance_weights,
        )
        output.loss.backward()
        return output


# ----- out of memory: retry the step with a smaller micro-batch, undoing what was applied ----------------


class OutOfMemoryAtMinimum(ApplianceError):
    """The step ran out of memory even at the smallest micro-batch."""


def halved_micro_batch(size: int, error: BaseException, ledger: Ledger | None = None) -> int:
    """The micro-batch to retry an out-of-memory step with (recorded in `ledger`); at 1, OutOfMemoryAtMinimum."""
    if size <= 1:
        raise OutOfMemoryAtMinimum(
            f"out of memory even at micro-batch {size}; lower grpo.group_size or grpo.max_new_tokens"
        ) from error
    # Halving: each retry frees about half the activations, and few retries reach the minimum.
    smaller = max(1, size // 2)
    if ledger is not None:
        ledger.record_halving(size, smaller, error)
    # Tensors of the failed attempt that only reference cycles still hold are freed first, so that emptying
    # the cache can hand their blocks back too: the retry starts from the live tensors only.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return smaller


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


class UpdateSnapshot:
    """The trainable parameters and optimizer state at one moment, on the CPU."""

    def __init__(self, student, optimizer):
        self.student, self.optimizer = student, optimizer
        self.parameters = [p.detach().to("cpu", copy=True) for p in student.trainable_parameters()]
        self.optimizer_state = _to_cpu(optimizer.state_dict())

    def restore(self) -> None:
        with torch.no_grad():
            for parameter, saved in zip(self.student.trainable_parameters(), self.parameters):
                parameter.copy_(saved.to(parameter.device))
        self.optimizer.load_state_dict(self.optimizer_state)


# ----- the optimizer and its schedule: AdamW over the LoRA parameters --------------------------------------


def make_optimizer(parameters, spec: GrpoSpec, device: str) -> torch.optim.Optimizer:
    """bitsandbytes' paged 8-bit AdamW on CUDA (less memory, spills to host under pressure), torch's on the CPU."""
    if device.startswith("cuda"):
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(parameters, lr=spec.learning_rate, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(parameters, lr=spec.learning_rate, weight_decay=spec.weight_decay)


def lr_factor(step: int, spec: GrpoSpec) -> float:
    """Multiplier of the base learning rate for optimizer step `step` (0-based)."""
    if spec.warmup_steps and step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.lr_schedule == "cosine":
        span = max(1, spec.steps - spec.warmup_steps)
        progress = min(1.0, (step - spec.warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def make_scheduler(optimizer: torch.optim.Optimizer, spec: GrpoSpec) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then constant or cosine decay to zero at the last step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, spec))
