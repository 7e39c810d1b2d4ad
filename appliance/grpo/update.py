"""One optimizer step of GRPO on a scored rollout: micro-batches, loss, backward, clip, step.

Only completions of informative groups reach this module (groups whose
rewards were all equal carry zero advantage and were dropped by the caller).
With `iterations` > 1 the same rollout is reused; the ratio is then taken
against logprobs stored before the first update (old policy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from appliance.config.schema import GrpoSpec
from appliance.grpo.loss import StepNormalizer, policy_loss
from appliance.grpo.student import Student, TokenBatch, pack_batch


@dataclass
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    # Logprobs from the engine that sampled it (vLLM): enables truncated importance sampling.
    engine_logprobs: list[float] | None = None


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


class InjectedOutOfMemory(torch.OutOfMemoryError):
    """Raised by the test hook to rehearse the out-of-memory path on machines without a GPU."""


def _chunks(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def _batch(student: Student, samples: list[TrainSample]) -> TokenBatch:
    return pack_batch([s.prompt_ids for s in samples], [s.completion_ids for s in samples], student.pad_id)


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([row + [0.0] * (width - len(row)) for row in rows], dtype=torch.float32)


class GrpoUpdater:
    """Applies GRPO updates to a student; holds no state besides the optimizer it is given."""

    def __init__(self, student: Student, optimizer, scheduler, spec: GrpoSpec, importance_sampling_cap: float = 2.0):
        self.student = student
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.spec = spec
        self.importance_sampling_cap = importance_sampling_cap
        self.inject_oom_once = False  # test hook: raise one OutOfMemoryError inside the next backward

    def _old_logprobs(self, micro_batches: list[list[TrainSample]]) -> list[torch.Tensor | None]:
        if self.spec.iterations == 1:
            return [None] * len(micro_batches)  # ratio against the detached current logprobs
        with torch.no_grad():
            return [self.student.completion_logprobs(_batch(self.student, mb), self.spec.temperature).detach()
                    for mb in micro_batches]

    def step(self, samples: list[TrainSample], micro_batch_size: int) -> UpdateStats:
        stats = UpdateStats(sequences=len(samples), tokens=sum(len(s.completion_ids) for s in samples))
        if not samples:
            return stats
        micro_batches = _chunks(samples, micro_batch_size)
        normalizer = StepNormalizer(len(samples), stats.tokens, len(micro_batches), self.spec.max_new_tokens)
        old = self._old_logprobs(micro_batches)
        parameters = self.student.trainable_parameters()
        diffs: list[torch.Tensor] = []
        for _ in range(self.spec.iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for micro, old_logp in zip(micro_batches, old):
                output = self._micro_step(micro, old_logp, normalizer, diffs)
                stats.loss += float(output.loss.detach())
                stats.kl += output.kl_mean / len(micro_batches)
                stats.clip_ratio += output.clip_ratio / len(micro_batches)
                stats.micro_batches += 1
            stats.grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, self.spec.max_grad_norm))
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats.loss /= self.spec.iterations
        stats.kl /= self.spec.iterations
        stats.clip_ratio /= self.spec.iterations
        if diffs:
            joined = torch.cat(diffs)
            stats.logprob_diff_mean, stats.logprob_diff_max = float(joined.mean()), float(joined.max())
        return stats

    def _micro_step(self, micro: list[TrainSample], old_logp, normalizer: StepNormalizer, diffs: list):
        batch = _batch(self.student, micro)
        logp = self.student.completion_logprobs(batch, self.spec.temperature)
        mask = batch.completion_mask.to(logp.device).float()
        advantages = torch.tensor([s.advantage for s in micro], dtype=torch.float32, device=logp.device)
        ref_logp = None
        if self.spec.beta > 0:
            ref_logp = self.student.completion_logprobs(batch, self.spec.temperature, reference=True)
        weights = None
        if all(s.engine_logprobs is not None for s in micro):
            engine_logp = _padded([s.engine_logprobs for s in micro], logp.shape[1]).to(logp.device)
            from appliance.engines.importance import truncated_importance_weights

            weights, _ = truncated_importance_weights(logp.detach(), engine_logp, mask, self.importance_sampling_cap)
            diffs.append((logp.detach() - engine_logp).abs()[mask.bool()])
        output = policy_loss(
            logp, logp.detach() if old_logp is None else old_logp, advantages, mask, self.spec.loss, normalizer,
            self.spec.epsilon, self.spec.epsilon_high, self.spec.beta, ref_logp, weights,
        )
        if self.inject_oom_once:
            self.inject_oom_once = False
            raise InjectedOutOfMemory("injected out-of-memory (test hook)")
        output.loss.backward()
        return output
