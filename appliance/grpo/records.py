"""What a run leaves behind besides checkpoints: metrics.jsonl, samples.jsonl, judge.jsonl, log.txt, eval.json;
and the trainer's view of the judge whose calls those records count (`judging_for`).

Each JSONL line is flushed and fsynced as it is written, so a crash loses at
most the line being written. On resume, lines for steps after the checkpoint
are dropped from metrics, samples and judge records (those steps run again). samples.jsonl is bounded: when it grows
past its limit it is rotated to samples.jsonl.1 (one generation kept).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from typing import TYPE_CHECKING, Protocol

from appliance.engines.engine import GenerationEngine
from appliance.judge.log import JudgeLog


SAMPLES_LIMIT_BYTES = 20 * 2**20


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=float) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from a crash
    return rows


def truncate_after_step(path: Path, step: int) -> None:
    """Keep only the records of steps <= step (and records without a step)."""
    if not Path(path).is_file():
        return
    kept = [row for row in read_jsonl(path) if row.get("step", 0) <= step]
    temporary = Path(path).with_suffix(".jsonl.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class RunRecords:
    def __init__(
        self,
        job_dir: Path,
        samples_limit_bytes: int = SAMPLES_LIMIT_BYTES,
        on_log: Callable[[str], None] | None = None,
    ):
        self.job_dir = Path(job_dir)
        self.on_log = on_log  # also hears every log line (the trainer turns them into "log" events)
        self.metrics_path = self.job_dir / "metrics.jsonl"
        self.samples_path = self.job_dir / "samples.jsonl"
        self.judge_path = self.job_dir / "judge.jsonl"
        self.log_path = self.job_dir / "log.txt"
        self.samples_limit_bytes = samples_limit_bytes

    def rewind_to(self, step: int, checkpoint_record: dict | None = None) -> None:
        """Drop the lines of steps after `step` (they run again after a resume).

        A crash between writing step `step`'s checkpoint and its metrics line would lose that
        line for good (the step does not run again): the checkpoint's copy of the record
        (`checkpoint_record`) is written back then.
        """
        for path in (self.metrics_path, self.samples_path, self.judge_path):
            truncate_after_step(path, step)
        if checkpoint_record is not None and not any(row.get("step") == step for row in read_jsonl(self.metrics_path)):
            append_jsonl(self.metrics_path, checkpoint_record)

    def metrics(self, record: dict) -> None:
        append_jsonl(self.metrics_path, record)

    def samples(self, records: list[dict]) -> None:
        if self.samples_path.is_file() and self.samples_path.stat().st_size > self.samples_limit_bytes:
            os.replace(self.samples_path, self.samples_path.with_suffix(".jsonl.1"))
        for record in records:
            append_jsonl(self.samples_path, record)

    def evaluations(self, evaluations: dict[str, dict]) -> None:
        """eval.json: the run's held-out evaluations by when they ran (before, after)."""
        from appliance.durable import write_atomically

        write_atomically(self.job_dir / "eval.json", json.dumps(evaluations, indent=2))

    def log(self, line: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line.rstrip()}\n")
        if self.on_log is not None:
            self.on_log(line)


# ----- a step's figures, added up over the ranks of a data-parallel job -------------------------------------


@dataclass(frozen=True)
class StepFigures:
    """What a step's record reads of its rollout: reward means and spreads, group and completion counts.

    Made from this rank's share and, in a data-parallel job, added up over the ranks from numbers alone (sums and
    counts, then the squared distances to the step's means), so the record reads as one rank's with the whole
    batch; no rollout crosses between ranks.
    """

    reward_mean: float
    reward_std: float  # sample standard deviation of the weighted totals
    rewards: dict[str, tuple[float, float]]  # function (and "total") -> (mean, population std)
    groups_total: int
    groups_informative: int
    groups_trained: int
    completions: int
    completion_length_mean: float
    completion_length_max: int

    @classmethod
    def of(cls, scored, world: RankInfo) -> "StepFigures":
        columns = dict(scored.scores.per_function, total=scored.scores.total)
        lengths = scored.completion_lengths
        counts = [len(scored.groups), int(scored.advantages.informative.sum()), int(scored.trained.sum())]
        if world.world_size == 1:  # the exact statistics of the one share there is
            return cls._of_values(columns, lengths, counts)
        names = list(columns)
        totals = world.sum([len(lengths), sum(lengths), *counts, *(math.fsum(columns[name]) for name in names)])
        n, length_sum, groups, informative, trained = (int(value) for value in totals[:5])
        means = {name: value / n if n else 0.0 for name, value in zip(names, totals[5:])}
        squares = dict(
            zip(names, world.sum([math.fsum((v - means[name]) ** 2 for v in columns[name]) for name in names]))
        )
        (longest,) = world.max([max(lengths, default=0)])
        spread = {name: math.sqrt(squares[name] / n) if n else 0.0 for name in names}
        return cls(
            reward_mean=means["total"],
            reward_std=math.sqrt(squares["total"] / (n - 1)) if n >= 2 else 0.0,
            rewards={name: (means[name], spread[name]) for name in names},
            groups_total=groups,
            groups_informative=informative,
            groups_trained=trained,
            completions=n,
            completion_length_mean=length_sum / n if n else 0.0,
            completion_length_max=longest,
        )

    @classmethod
    def _of_values(cls, columns: dict[str, list[float]], lengths: list[int], counts: list[int]) -> "StepFigures":
        total = columns["total"]
        return cls(
            reward_mean=statistics.fmean(total) if total else 0.0,
            reward_std=statistics.stdev(total) if len(total) >= 2 else 0.0,
            rewards={
                name: (statistics.fmean(values), statistics.pstdev(values)) if values else (0.0, 0.0)
                for name, values in columns.items()
            },
            groups_total=counts[0],
            groups_informative=counts[1],
            groups_trained=counts[2],
            completions=len(lengths),
            completion_length_mean=statistics.fmean(lengths) if lengths else 0.0,
            completion_length_max=max(lengths) if lengths else 0,
        )


# ----- the trainer's view of the job's judge: its engine, token and time totals, outcomes and log ----------
# `JudgeSeat` around the job's Judge, or `NoJudge` when the job has none, whose answers are what a step without
# a judge records.


if TYPE_CHECKING:  # the daemon reads records through export without loading torch
    from appliance.grpo.distributed import RankInfo
    from appliance.judge.judge import Judge


class Judging(Protocol):
    engine: GenerationEngine | None  # handed to the time-share after the student's engine

    def set_step(self, step: int) -> None: ...

    def engines(self) -> list[GenerationEngine]: ...

    def totals(self) -> dict: ...

    def split_seconds(self, seconds: dict[str, float], before: dict) -> dict[str, float]: ...

    def outcomes(self) -> dict[str, int]: ...

    def log_to(self, path: Path) -> None: ...

    def close(self) -> None: ...


def judging_for(judge: Judge | None) -> Judging:
    return NoJudge() if judge is None else JudgeSeat(judge)


class NoJudge:
    """A job without a judge: no engine, no totals, no judge phase, no outcomes."""

    engine = None

    def set_step(self, step: int) -> None:
        pass

    def engines(self) -> list[GenerationEngine]:
        return []

    def totals(self) -> dict:
        return {}

    def split_seconds(self, seconds: dict[str, float], before: dict) -> dict[str, float]:
        return seconds

    def outcomes(self) -> dict[str, int]:
        return {}

    def log_to(self, path: Path) -> None:
        pass

    def close(self) -> None:
        pass


class JudgeSeat:
    """The job's Judge as the trainer sees it."""

    def __init__(self, judge: Judge):
        self.judge = judge

    @property
    def engine(self) -> GenerationEngine:
        return self.judge.engine

    def set_step(self, step: int) -> None:
        self.judge.set_step(step)

    def engines(self) -> list[GenerationEngine]:
        return [self.engine]

    def totals(self) -> dict:
        """The judge's own token and second totals so far (its engine's counters may be the student's)."""
        stats = self.judge.stats()
        return {"judge": (stats["generated_tokens"], stats["prompt_tokens"]), "judge_seconds": stats["seconds"]}

    def split_seconds(self, seconds: dict[str, float], before: dict) -> dict[str, float]:
        """The judge's share of the reward phase shown as its own phase (`before` is totals() at step start)."""
        judged = self.judge.stats()["seconds"] - before["judge_seconds"]
        seconds["judge"] = judged
        seconds["reward"] = max(0.0, seconds.get("reward", 0.0) - judged)
        return seconds

    def outcomes(self) -> dict[str, int]:
        return dict(self.judge.outcomes)

    def log_to(self, path: Path) -> None:
        """Write the judge's log lines to `path` from now on (a data-parallel rank other than 0)."""
        if self.judge.log is not None:
            self.judge.log.close()
            self.judge.log = JudgeLog(path, self.judge.spec.log_max_bytes, self.judge.spec.log_backups)

    def close(self) -> None:
        self.judge.close()
