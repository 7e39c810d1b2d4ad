"""One data-parallel rank of a GRPO job: its share of the groups, global records, rank 0 writing.

Each rank draws the whole step's problems from the same stream and keeps its
contiguous share, samples and scores them on its own engine and trains on
them (grpo/distributed.py sums the gradients). The step's record is built
from every rank's rollout gathered in rank order, so it reads as one rank's
with the whole batch. Rank 0 alone writes checkpoints, best/ and records,
after a barrier; each rank's RNG state goes into the checkpoint, and a
checkpoint from another world size is refused. The held-out evaluation is
split the same way: each rank evaluates its part, every rank gets the merge.
With resources.sharding fsdp the base is sharded over the ranks (grpo/fsdp.py)
and gathered whole where generation goes through it.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import nullcontext
from pathlib import Path

import torch

from appliance.grpo import distributed
from appliance.grpo.checkpoint import CheckpointManager, load_tensors, restore_rng_state, rng_state
from appliance.grpo.distributed import DistributedError, GradientReducer, RankInfo
from appliance.grpo.evaluate import merge_evaluations
from appliance.grpo.fsdp import generates_with, layer_elements_held, remerges_from, shard_student, whole_weights
from appliance.grpo.records import RunRecords
from appliance.grpo.rollout import ScoredRollout
from appliance.grpo.sampling import concat_rollouts
from appliance.grpo.trainer import Trainer
from appliance.grpo.update import UpdateStats

WORLD_FILE = "world.json"


def rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


class RankStream:
    """The job's problem stream as one rank sees it: the whole batch drawn, this rank's share kept."""

    def __init__(self, stream, info: RankInfo):
        self.stream, self.info = stream, info

    def next_batch(self, count: int):
        return distributed.share(self.stream.next_batch(count), self.info.rank, self.info.world_size)

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)


class SilentRecords(RunRecords):
    """A rank other than 0 writes no records (rank 0 writes the job's)."""

    def rewind_to(self, step: int, checkpoint_record: dict | None = None) -> None:
        pass

    def metrics(self, record: dict) -> None:
        pass

    def samples(self, records: list[dict]) -> None:
        pass

    def evaluations(self, evaluations: dict[str, dict]) -> None:
        pass

    def log(self, line: str) -> None:
        pass


class ReadOnlyCheckpoints(CheckpointManager):
    """A rank other than 0 reads the job's checkpoints but writes none."""

    def save(self, step, write_payload, state):
        return self.root / f"step-{step:06d}"

    def update_best(self, write_adapter, state):
        return self.job_dir / "best"

    def reconcile_best(self, resumed):
        """What rank 0's repair of best/ will give, without touching best/ (rank 0 repairs it)."""
        state = self.best_state()
        if state is not None and (self.best_dir / "adapter_model.safetensors").is_file():
            return state
        recorded = resumed.state.get("best")
        if recorded and (self.root / f"step-{int(recorded['step']):06d}" / "adapter").is_dir():
            return recorded
        return None


class RankTrainer(Trainer):
    """A Trainer that is one rank of a data-parallel job (see the module docstring)."""

    def __init__(self, *args, rank: RankInfo, sharding: str = "ddp", **kwargs):
        super().__init__(*args, **kwargs)
        self.rank = rank
        if rank.world_size != self.spec.resources.world_size:
            raise DistributedError(
                f"this run has {rank.world_size} ranks but the job's resources give "
                f"{self.spec.resources.world_size}; start it with 'appliance train', which launches what resources say"
            )
        if self.spec.task.environment is not None:
            raise DistributedError("agent jobs (task.environment) run on one rank; set resources.gpus: 1")
        if self.spec.resources.judge_gpus:
            raise DistributedError(
                "a judge on devices of its own (resources.judge_gpus) is not shared by several ranks yet; serve it "
                "with 'vllm serve --tensor-parallel-size N' on those devices and set judge.endpoint, or drop judge_gpus"
            )
        self.source.stream = RankStream(self.source.stream, rank)
        self.eval_part = (rank.rank, rank.world_size)
        self.updater.reducer = GradientReducer(lockstep=sharding == "fsdp")
        GradientReducer.broadcast_parameters(self.student.trainable_parameters())
        if not rank.is_main:
            self.records = SilentRecords(self.job_dir)
            self.checkpoints = ReadOnlyCheckpoints(self.job_dir, self.spec.checkpoint.keep_last)
            self.judging.log_to(self.job_dir / f"judge.rank{rank.rank}.jsonl")  # judge.jsonl is rank 0's
        if sharding == "fsdp":  # ddp: the whole base on every rank; fsdp: sharded over them (grpo/fsdp.py)
            shard_student(self.student.model, rank)
            held, whole = layer_elements_held(self.student.model)
            self.records.log(
                f"the student's base is sharded over {rank.world_size} ranks with FSDP: each holds {held:,} of the "
                f"decoder layers' {whole:,} weights (embeddings and head whole); generation gathers them whole"
            )
        self._local: ScoredRollout | None = None

    # ----- the step: local rollout and update, global record ----------------------------------------

    def _rollout(self, clock) -> ScoredRollout:
        model = self.student.model
        with self._whole_base(generates_with(self.engine, model) or generates_with(self.judging.engine, model)):
            self._local = super()._rollout(clock)
        # Every rank's share in rank order: the rollout one rank with the whole batch would have made.
        return concat_rollouts(distributed.gather(self._local))

    def _sync_engine(self) -> None:
        with self._whole_base(remerges_from(self.engine, self.student.model)):
            super()._sync_engine()

    def evaluate_held_out(self, adapter: bool = True, limit: int | None = None):
        """Each rank evaluates its part of the held-out problems; every rank gets the merged evaluation."""
        engine = self._policy_engine(adapter)  # None: the student's own weights
        with self._whole_base(engine is None or generates_with(engine, self.student.model)):
            local = super().evaluate_held_out(adapter, limit)
        return merge_evaluations(distributed.gather(local))

    def _whole_base(self, needed: bool):
        """A sharded base gathered whole while `needed` (ranks generate through it); otherwise nothing."""
        return whole_weights(self.student.model) if needed else nullcontext()

    def _sampling(self, step: int):
        sampling = super()._sampling(step)  # each rank draws its own completions, the same on every resume
        return dataclasses.replace(sampling, seed=(sampling.seed + 7919 * self.rank.rank) % (2**31 - 1))

    def _update(self, scored) -> UpdateStats:
        stats = super()._update(self._local)
        sequences, tokens = GradientReducer().counts(stats.sequences, stats.tokens)
        return dataclasses.replace(stats, sequences=sequences, tokens=tokens)

    def _token_totals(self) -> dict:
        """The engines' counters summed over ranks: the job's tokens/s is the sum of every rank's."""
        parts = distributed.gather(super()._token_totals())
        return {
            key: tuple(map(sum, zip(*(part[key] for part in parts))))
            if isinstance(parts[0][key], tuple)
            else sum(part[key] for part in parts)
            for key in parts[0]
        }

    # ----- checkpoints: every rank's RNG, rank 0 writing, one world size ------------------------------

    def save_checkpoint(self, record) -> Path:
        self._rng_states = distributed.gather(rng_state())
        distributed.barrier()  # every rank finished the step before rank 0 writes it
        path = super().save_checkpoint(record)
        distributed.barrier()  # nobody runs ahead of a checkpoint still being written
        return path

    def _write_payload(self, folder: Path) -> None:
        super()._write_payload(folder)
        for index, state in enumerate(self._rng_states):
            torch.save(state, folder / rng_file(index))
        (folder / WORLD_FILE).write_text(json.dumps({"world_size": self.rank.world_size}))

    def resume(self) -> int | None:
        check_world_size(self.job_dir, self.rank.world_size)
        step = super().resume()
        if step is not None:
            restore_rng_state(load_tensors(self.checkpoints.root / f"step-{step:06d}" / rng_file(self.rank.rank)))
        return step


def check_world_size(job_dir: Path, world_size: int) -> None:
    """Refuse to resume a checkpoint written by another number of ranks (their RNG and shares differ)."""
    latest = CheckpointManager(job_dir, 1).latest()
    if latest is None:
        return
    saved = _world_size_of(latest.path)
    if saved != world_size:
        raise DistributedError(
            f"checkpoint {latest.path.name} was written by {saved} data-parallel rank(s) and this run has "
            f"{world_size}; resume with resources giving {saved} rank(s), or --restart"
        )


def _world_size_of(folder: Path) -> int:
    world = folder / WORLD_FILE
    return json.loads(world.read_text())["world_size"] if world.is_file() else 1
