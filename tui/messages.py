"""Every message the client's workers post: data from the daemon, its reachability, results of actions.

Workers (threads running blocking client calls) post these; screens and the
app update widgets only in their handlers (DESIGN.md habit 4). Payloads are
the daemon's own API types (appliance.service.api, StepRecord included).
"""

from __future__ import annotations

from pathlib import Path

from textual.message import Message

from appliance.service.api import DeviceStatus, JobDetail, JobSummary, JsonObject, StepRecord


class DaemonUnreachable(Message):
    """A call to the control socket failed to connect or was cut off; pollers keep retrying."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class PollFailed(Message):
    """A poller's fetch raised something other than a refusal (a bug, an answer of another version); it retries."""

    def __init__(self, group: str, text: str) -> None:
        super().__init__()
        self.group = group
        self.text = text


class PollRecovered(Message):
    """A poller that had failed fetched again."""

    def __init__(self, group: str) -> None:
        super().__init__()
        self.group = group


class DaemonVersion(Message):
    """The daemon's /status: its version and API version, or why they could not be read."""

    def __init__(self, version: str | None, api_version: int | None, problem: str | None) -> None:
        super().__init__()
        self.version = version
        self.api_version = api_version
        self.problem = problem


class DaemonReachable(Message):
    """A call succeeded after the daemon had been unreachable (or for the first time)."""


class JobsLoaded(Message):
    """The daemon's job list, each job's recent step records (oldest first) and its memory budget."""

    def __init__(
        self, jobs: list[JobSummary], records: dict[str, list[StepRecord]], budgets: dict[str, int | None]
    ) -> None:
        super().__init__()
        self.jobs = jobs
        self.records = records
        self.budgets = budgets


class JobLoaded(Message):
    """One job in full: spec, state, events, plan, checkpoints, best."""

    def __init__(self, job: JobDetail) -> None:
        super().__init__()
        self.job = job


class StepsArrived(Message):
    """New step records of a job, in step order (the first page, or the steps after the last one shown)."""

    def __init__(self, job_id: str, records: list[StepRecord]) -> None:
        super().__init__()
        self.job_id = job_id
        self.records = records


class SamplesLoaded(Message):
    """The samples of one step: each prompt with its group of completions."""

    def __init__(self, job_id: str, step: int | None, steps: list[int], samples: list[JsonObject]) -> None:
        super().__init__()
        self.job_id = job_id
        self.step = step
        self.steps = steps
        self.samples = samples


class JudgeLoaded(Message):
    """Judge log entries, filtered by outcome (None: all)."""

    def __init__(self, job_id: str, outcome: str | None, entries: list[JsonObject]) -> None:
        super().__init__()
        self.job_id = job_id
        self.outcome = outcome
        self.entries = entries


class LogLoaded(Message):
    """Lines of a job's log.txt after the ones already shown."""

    def __init__(self, job_id: str, lines: list[str], reset: bool) -> None:
        super().__init__()
        self.job_id = job_id
        self.lines = lines
        self.reset = reset


class DeviceLoaded(Message):
    """Device and budget status: planned vs used bytes per component, phase now, time sharing."""

    def __init__(self, status: DeviceStatus, plans: dict[str, JsonObject]) -> None:
        super().__init__()
        self.status = status
        self.plans = plans  # job id -> its memory plan, for the jobs on the device


class HistoriesLoaded(Message):
    """Whole step histories of several jobs (the compare screen)."""

    def __init__(self, histories: dict[str, list[StepRecord]], names: dict[str, str]) -> None:
        super().__init__()
        self.histories = histories
        self.names = names


class JobChanged(Message):
    """A job changed state (from the daemon's events long-poll)."""

    def __init__(self, job_id: str, name: str, state: str, reason: str | None) -> None:
        super().__init__()
        self.job_id = job_id
        self.name = name
        self.state = state
        self.reason = reason


class ActionDone(Message):
    """pause / resume / cancel / submit succeeded; `text` says what happened."""

    def __init__(self, action: str, job_id: str | None, text: str) -> None:
        super().__init__()
        self.action = action
        self.job_id = job_id
        self.text = text


class ActionFailed(Message):
    """The daemon refused an action, or could not be reached; `text` is its sentence."""

    def __init__(self, action: str, job_id: str | None, text: str) -> None:
        super().__init__()
        self.action = action
        self.job_id = job_id
        self.text = text


class Validated(Message):
    """A dry-run submit: the memory plan when the job is valid, else every error."""

    def __init__(self, ok: bool, errors: list[str], plan: JsonObject | None) -> None:
        super().__init__()
        self.ok = ok
        self.errors = errors
        self.plan = plan


class ExamplesFound(Message):
    """The example job files found on disk (the new job screen's picker)."""

    def __init__(self, paths: list[Path]) -> None:
        super().__init__()
        self.paths = paths


class JobFileRead(Message):
    """A job file read from disk: its text, or why it could not be read."""

    def __init__(self, path: Path, text: str | None, problem: str | None) -> None:
        super().__init__()
        self.path = path
        self.text = text
        self.problem = problem
