"""The blocking calls (the daemon, job files on disk), each returning typed messages; workers run them.

Reads raise the client's errors and tui.polling turns them into messages
(DaemonUnreachable, ActionFailed) so that a poller keeps going and reconnects
by itself; actions (pause, resume, cancel, submit) return their refusal as a
message themselves.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from appliance.service.api import API_VERSION, TERMINAL_STATES, JobSummary, StepRecord
from appliance.service.client import Client, ClientError
from tui import messages
from tui.views import TREND_STEPS

# A poller that finds the daemon gone waits this long before the next try.
RETRY_SECONDS = 2.0
# The events long-poll: the daemon answers at once when something happens, else after this.
EVENTS_WAIT_SECONDS = 5.0
LOG_BYTES = 64 * 1024  # the log's tail shown when a job screen opens; later reads follow from there


class Wakeup:
    """Waits on the daemon's events long-poll: returns as soon as something happens (to one job, or any)."""

    def __init__(self, client: Client, job_id: str | None = None):
        self.client, self.job_id = client, job_id
        self.cursor: int | None = None

    def wait(self, seconds: float = EVENTS_WAIT_SECONDS) -> None:
        """The first call returns at once (and learns the cursor); later ones when there is news, or after `seconds`."""
        timeout = 0.0 if self.cursor is None else seconds
        try:
            self.cursor = self.client.events(after=self.cursor or 0, job_id=self.job_id, timeout=timeout).cursor
        except ClientError:
            self.cursor = None  # after an outage, fetch at once instead of waiting for news
            raise


class JobsFeed:
    """The job list plus each job's recent step records (for the trend, tok/s and memory columns)."""

    def __init__(self, client: Client):
        self.client = client
        self.wakeup = Wakeup(client)
        self.records: dict[str, list[StepRecord]] = {}
        self.budgets: dict[str, int | None] = {}

    def poll(self) -> messages.JobsLoaded:
        """The list now, then again whenever the daemon has news (or every few seconds, for the ages)."""
        self.wakeup.wait()
        jobs = self.client.jobs()
        for job in jobs:
            self._catch_up(job)
        return messages.JobsLoaded(
            jobs,
            {job.id: list(self.records.get(job.id, [])) for job in jobs},
            {job.id: self.budgets.get(job.id) for job in jobs},
        )

    def _catch_up(self, job: JobSummary) -> None:
        if job.id not in self.budgets:
            plan = self.client.job(job.id).plan
            self.budgets[job.id] = plan.get("budget_bytes") if plan else None
        known = self.records.setdefault(job.id, [])
        last = known[-1].step if known else max(0, job.step - TREND_STEPS)
        if job.step > last:
            page = self.client.metrics(job.id, after_step=last, limit=TREND_STEPS)
            known += [StepRecord.from_dict(record) for record in page.records]
            del known[:-TREND_STEPS]


class JobFeed:
    """One job in full and its new step records, fetched again whenever the daemon has news of it."""

    def __init__(self, client: Client, job_id: str):
        self.client, self.job_id = client, job_id
        self.wakeup = Wakeup(client, job_id)
        self.last_step = 0

    def poll(self) -> list:
        self.wakeup.wait()
        job = self.client.job(self.job_id)
        records = []
        after: int | None = self.last_step
        while after is not None:
            page = self.client.metrics(self.job_id, after_step=after)
            records += [StepRecord.from_dict(record) for record in page.records]
            after = page.next_after_step
        if records:
            self.last_step = records[-1].step
        return [messages.JobLoaded(job), messages.StepsArrived(self.job_id, records)]


def samples(client: Client, job_id: str, step: int | None) -> messages.SamplesLoaded:
    records = client.samples(job_id, limit=400).records
    steps = sorted({int(record.get("step", 0)) for record in records})
    chosen = step if step in steps else (steps[-1] if steps else None)
    return messages.SamplesLoaded(job_id, chosen, steps, [r for r in records if r.get("step") == chosen])


def judge(client: Client, job_id: str, outcome: str | None) -> messages.JudgeLoaded:
    return messages.JudgeLoaded(job_id, outcome, client.judge_log(job_id, outcome=outcome, limit=200).records)


class LogFeed:
    """The tail of a job's log, then what is appended to it."""

    def __init__(self, client: Client, job_id: str):
        self.client, self.job_id = client, job_id
        self.offset: int | None = None
        self.partial = ""  # a line still being written

    def poll(self) -> messages.LogLoaded | None:
        chunk = self.client.log(self.job_id, offset=-LOG_BYTES if self.offset is None else self.offset)
        reset = self.offset is None or chunk.size < self.offset  # first read, or the log was truncated
        if reset:
            self.partial = ""
        if not chunk.text and not reset:
            return None
        text = chunk.text
        if self.offset is None and chunk.offset > 0:
            text = text.partition("\n")[2]  # the tail starts mid-line
        self.offset = chunk.next_offset
        *lines, self.partial = (self.partial + text).split("\n")
        # Progress bars redraw a line with carriage returns: keep what a terminal would show last.
        return messages.LogLoaded(self.job_id, [line.rsplit("\r", 1)[-1] for line in lines], reset)


def device(client: Client) -> messages.DeviceLoaded:
    status = client.device()
    plans = {}
    for slot in status.slots:
        if slot.job_id is not None:
            plans[slot.job_id] = client.job(slot.job_id).plan or {}
    return messages.DeviceLoaded(status, plans)


class HistoriesFeed:
    """Several jobs' whole step histories (the compare screen): read once, then only the steps after the last."""

    def __init__(self, client: Client, job_ids: list[str]):
        self.client = client
        self.names: dict[str, str] = {}
        self.records: dict[str, list[StepRecord]] = {job_id: [] for job_id in job_ids}

    def poll(self) -> messages.HistoriesLoaded:
        for job_id, known in self.records.items():
            if job_id not in self.names:
                self.names[job_id] = self.client.job(job_id).name
            after: int | None = known[-1].step if known else 0
            while after is not None:
                page = self.client.metrics(job_id, after_step=after)
                known += [StepRecord.from_dict(record) for record in page.records]
                after = page.next_after_step
        return messages.HistoriesLoaded(
            {job_id: list(known) for job_id, known in self.records.items()}, dict(self.names)
        )


class EventsFeed:
    """State changes from the daemon's events long-poll, starting at the events that follow now."""

    def __init__(self, client: Client):
        self.client = client
        self.cursor: int | None = None
        self.names: dict[str, str] = {}

    def poll(self) -> list[messages.JobChanged]:
        if self.cursor is None:
            self.cursor = self.client.events(after=0).cursor  # only what happens from now on
            return []
        page = self.client.events(after=self.cursor, timeout=EVENTS_WAIT_SECONDS)
        self.cursor = page.cursor
        changes = []
        for event in page.events:
            if event.kind != "state":
                continue
            if event.job_id not in self.names:
                self.names[event.job_id] = self.client.job(event.job_id).name
            changes.append(
                messages.JobChanged(
                    event.job_id,
                    self.names[event.job_id],
                    str(event.data.get("to", "")),
                    event.data.get("reason") or None,
                )
            )
        return changes


ASKED = {"pause": "pausing", "resume": "resuming", "cancel": "cancelling"}


def act(client: Client, action: str, job_id: str) -> messages.ActionDone | messages.ActionFailed:
    """pause / resume / cancel one job; the daemon's refusal comes back as its sentence."""
    call = {"pause": client.pause, "resume": client.resume, "cancel": client.cancel}[action]
    try:
        job = call(job_id)
    except ClientError as error:  # DaemonUnreachable included
        return messages.ActionFailed(action, job_id, str(error))
    # A running job pauses or stops at the end of its step: the state change is notified when it happens.
    return messages.ActionDone(action, job_id, f"{ASKED[action]} {job.name} ({job.id}); it is {job.state} now")


def submit(
    client: Client, file_name: str, text: str, dry_run: bool
) -> messages.Validated | messages.ActionDone | messages.ActionFailed:
    try:
        response = client.submit_text(file_name, text, dry_run=dry_run)
    except ClientError as error:
        errors = error.errors or [str(error)]
        if dry_run:
            return messages.Validated(False, errors, error.plan)
        return messages.ActionFailed("submit", None, "\n".join(errors))
    if dry_run:
        return messages.Validated(True, [], response.plan)
    job = response.job
    return messages.ActionDone("submit", job.id, f"submitted {job.name} ({job.id}): {job.state}")


def daemon_version(client: Client) -> messages.DaemonVersion:
    """The daemon's version and API version, or why its /status cannot be read by this client."""
    try:
        status = client.status()
    except ValidationError as error:
        return messages.DaemonVersion(
            None, None, f"its /status answer does not match this client's API ({error.error_count()} fields differ)"
        )
    return messages.DaemonVersion(status.version, status.api_version, None)


def version_problem(message: messages.DaemonVersion) -> str | None:
    """One sentence when the daemon speaks another API version than this client, else None."""
    if message.problem is None and message.api_version == API_VERSION:
        return None
    daemon = message.problem or f"the daemon {message.version} speaks API v{message.api_version}"
    return (
        f"Version mismatch: this client speaks API v{API_VERSION} and {daemon}; "
        "install the same appliance version for the client and the daemon"
    )


def example_files(folders: list[Path]) -> messages.ExamplesFound:
    """Job files (*.yaml) in the folders that exist; the first of a name wins."""
    found: dict[str, Path] = {}
    for folder in folders:
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found.setdefault(path.name, path)
    return messages.ExamplesFound(list(found.values()))


def read_job_file(path: Path) -> messages.JobFileRead:
    """A job file's text, or why it cannot be read."""
    try:
        return messages.JobFileRead(path, path.read_text(encoding="utf-8"), None)
    except (OSError, UnicodeDecodeError) as error:
        return messages.JobFileRead(path, None, f"cannot read {path}: {error}")


def is_final(state: str) -> bool:
    return state in TERMINAL_STATES
