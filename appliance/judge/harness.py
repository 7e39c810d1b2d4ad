"""Judge quality on labelled rows: AUC, pairwise accuracy, position bias, failures, latency, tokens.

A labelled row is `{"question", "reference", "response", "label"}` (label 0/1,
or a grade: any number, higher is better; optional "id", "task"). The rows are
fed to a `Judge` the way a training step would feed it: in batches of about
`batch_rows` rows, the rows of one question forming one group (so group mode
judges them in one prompt). Every number comes from the judge's own log
(judge.jsonl in a temporary folder): outcome, latency and tokens per request.
Seconds per completion is the whole run's wall time over the rows (throughput).
Position bias (group mode) is the mean spread of a response's readings over
its group's orders (judge/grouping.py). `gold_answers` are what the injection
guard's false-positive rate is measured on: a task's own gold solutions.

`appliance judge eval` (cli/judge_cmd.py) prints these reports; the shipped set
is `appliance/judge/data/judge_set.jsonl` (made by bench/make_judge_set.py).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from appliance.errors import ApplianceError

DEFAULT_THRESHOLD = 0.5  # the middle of the 0..1 score: accuracy counts a score above it as "right"


class LabelledSetError(ApplianceError):
    """A labelled-set file cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class LabelledRow:
    question: str
    reference: str | None
    response: str
    label: float
    id: str = ""
    task: str = ""


def shipped_set_path() -> Path:
    return Path(str(resources.files("appliance.judge") / "data" / "judge_set.jsonl"))


def load_rows(path: Path) -> list[LabelledRow]:
    """Read and check every row; one error naming the file, line and field on the first bad one."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise LabelledSetError(f"{path}: cannot read the labelled set ({error})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise LabelledSetError(f"{path}:{number}: not a JSON object ({error})") from None
        if not isinstance(row, dict):
            raise LabelledSetError(f"{path}:{number}: expected a JSON object with question, response and label")
        for key in ("question", "response"):
            if not isinstance(row.get(key), str):
                raise LabelledSetError(f"{path}:{number}: '{key}' must be a string")
        label = row.get("label")
        if isinstance(label, bool) or not isinstance(label, (int, float)) or not math.isfinite(label):
            raise LabelledSetError(f"{path}:{number}: 'label' must be a number (0/1, or a grade), got {label!r}")
        reference = row.get("reference")
        rows.append(
            LabelledRow(
                row["question"],
                None if reference is None else str(reference),
                row["response"],
                float(label),
                str(row.get("id", number)),
                str(row.get("task", "")),
            )
        )
    if not rows:
        raise LabelledSetError(f"{path}: no rows")
    return rows


def auc(scores: list[float], labels: list[float]) -> float | None:
    """Area under the ROC curve for binary labels (ties count half); None without both classes."""
    positives = [s for s, y in zip(scores, labels) if y >= 0.5]
    negatives = [s for s, y in zip(scores, labels) if y < 0.5]
    if not positives or not negatives:
        return None
    ranks = _ranks(scores)
    positive_rank_sum = sum(r for r, y in zip(ranks, labels) if y >= 0.5)
    n_pos, n_neg = len(positives), len(negatives)
    # The Mann-Whitney U statistic over the pairs: AUC is the chance a positive outranks a negative.
    return (positive_rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def pairwise_accuracy(scores: list[float], labels: list[float], groups: list[tuple]) -> tuple[float | None, int]:
    """Within each group (one question), the share of pairs with different labels that the scores order
    the same way (ties count half), and the number of such pairs. GRPO uses only these rankings."""
    members: dict[tuple, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    agree, pairs = 0.0, 0
    for indices in members.values():
        for position, i in enumerate(indices):
            for j in indices[position + 1 :]:
                if labels[i] == labels[j]:
                    continue
                better, worse = (i, j) if labels[i] > labels[j] else (j, i)
                pairs += 1
                agree += 1.0 if scores[better] > scores[worse] else 0.5 if scores[better] == scores[worse] else 0.0
    return (agree / pairs if pairs else None), pairs


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None when either side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    if len(set(rx)) < 2 or len(set(ry)) < 2:
        return None
    return statistics.correlation(rx, ry)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q  # linear interpolation between the two nearest ranks
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class JudgeReport:
    """One judge configuration over a labelled set."""

    mode: str
    scoring: str
    rows: int
    requests: int
    auc: float | None  # pooled over all rows and questions
    # Within each question, pairs of rows with different labels ranked the labels' way (ties half): what GRPO sees.
    pairwise_accuracy: float | None
    pairs: int
    accuracy: float | None  # at `threshold`, binary labels only
    threshold: float
    spearman: float | None
    failure_rate: float
    failures: int
    seconds_per_completion: float
    # Per judge request (one response pointwise, one group): the wall time of the engine calls it waited
    # for, retries included; a step's requests share their calls, so this is what a step waits.
    latency_p50_seconds: float
    latency_p95_seconds: float
    prompt_tokens_per_completion: float
    generated_tokens_per_completion: float
    score_mean: float
    score_std: float
    # Group mode: the mean over responses of (highest - lowest) of its readings in its group's orders (None
    # pointwise): how much place sways this judge; the reward is the mean of the readings.
    position_bias: float | None = None
    # The differential check: responses read a second time as their core, and rewards capped at the core's score.
    core_readings: int = 0
    capped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def batches(rows: list[LabelledRow], batch_rows: int) -> list[list[int]]:
    """Row indices in step-sized batches; the rows of one question stay together (one group)."""
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault((row.question, row.reference), []).append(index)
    result: list[list[int]] = []
    current: list[int] = []
    for members in groups.values():
        if current and len(current) + len(members) > batch_rows:
            result.append(current)
            current = []
        current.extend(members)
    if current:
        result.append(current)
    return result


def evaluate_judge(
    rows: list[LabelledRow],
    make_judge: Callable[[Path], Any],
    threshold: float = DEFAULT_THRESHOLD,
    batch_rows: int = 16,
    clock: Callable[[], float] = time.monotonic,
) -> JudgeReport:
    """Run the judge that `make_judge(log_path)` builds over the rows and score it against the labels."""
    from appliance.rewards.registry import RewardSample

    scores: list[float] = [0.0] * len(rows)
    with tempfile.TemporaryDirectory(prefix="judge-eval-") as folder:
        log_path = Path(folder) / "judge.jsonl"
        judge = make_judge(log_path)
        started = clock()
        try:
            for batch in batches(rows, batch_rows):
                group_of = {}
                samples = []
                for index in batch:
                    row = rows[index]
                    group = group_of.setdefault((row.question, row.reference), len(group_of))
                    samples.append(
                        RewardSample(prompt=row.question, completion=row.response, reference=row.reference, group=group)
                    )
                for index, score in zip(batch, judge(samples)):
                    scores[index] = score
        finally:
            judge.close()
        seconds = clock() - started
        records = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    stats = judge.stats()
    # Judge requests only: a response the injection guard stopped has a line but no request.
    latencies = [record["latency_seconds"] for record in records if "latency_seconds" in record]
    labels = [row.label for row in rows]
    binary = set(labels) <= {0.0, 1.0}
    correct = [(score >= threshold) == (label >= 0.5) for score, label in zip(scores, labels)]
    pairwise, pairs = pairwise_accuracy(scores, labels, [(row.question, row.reference) for row in rows])
    return JudgeReport(
        mode=judge.spec.mode,
        scoring=judge.scoring,
        rows=len(rows),
        requests=stats["requests"],
        auc=auc(scores, labels) if binary else None,
        pairwise_accuracy=pairwise,
        pairs=pairs,
        accuracy=sum(correct) / len(correct) if binary else None,
        threshold=threshold,
        spearman=spearman(scores, labels),
        failure_rate=stats["failure_rate"],
        failures=stats["failures"],
        seconds_per_completion=seconds / len(rows),
        latency_p50_seconds=_percentile(latencies, 0.5),
        latency_p95_seconds=_percentile(latencies, 0.95),
        prompt_tokens_per_completion=stats["prompt_tokens"] / len(rows),
        generated_tokens_per_completion=stats["generated_tokens"] / len(rows),
        score_mean=statistics.fmean(scores),
        score_std=statistics.pstdev(scores),
        **{key: stats[key] for key in ("position_bias", "core_readings", "capped")},
    )


def format_table(reports: list[JudgeReport]) -> str:
    """The reports side by side, one line per mode, for people."""

    def number(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    header = (
        f"{'mode':<10} {'scoring':<13} {'rows':>5} {'AUC':>6} {'pair':>6} {'acc@t':>6} {'rho':>6} {'fail':>6} "
        f"{'pos':>6} {'s/compl':>8} {'p50 s':>7} {'p95 s':>7} {'tok in':>7} {'tok out':>7}"
    )
    lines = [header]
    for r in reports:
        lines.append(
            f"{r.mode:<10} {r.scoring:<13} {r.rows:>5} {number(r.auc, '.3f'):>6} "
            f"{number(r.pairwise_accuracy, '.3f'):>6} {number(r.accuracy, '.3f'):>6} "
            f"{number(r.spearman, '.3f'):>6} {r.failure_rate:>6.1%} {number(r.position_bias, '.3f'):>6} "
            f"{r.seconds_per_completion:>8.3f} "
            f"{r.latency_p50_seconds:>7.3f} {r.latency_p95_seconds:>7.3f} "
            f"{r.prompt_tokens_per_completion:>7.0f} {r.generated_tokens_per_completion:>7.1f}"
        )
    return "\n".join(lines)


def gold_answers(task_spec=None) -> tuple[str, list[tuple[str, str]]]:
    """(where they come from, [(question, gold answer)]): a task's own answers, its worked solutions where it has
    them; without a task, the shipped GSM8K gold solutions. Empty for an agent job (no dataset)."""
    from appliance.tasks.gsm8k import load_gsm8k
    from appliance.tasks.load import load_task

    if task_spec is None:
        return "builtin:gsm8k", [(p.question, p.metadata["solution"]) for p in load_gsm8k()]
    if task_spec.environment is not None:
        return f"environment {task_spec.environment}", []
    task = load_task(task_spec, Path("."))
    problems = task.train + task.held_out
    return task_spec.dataset, [(p.question, str(p.metadata.get("solution", p.answer))) for p in problems]
