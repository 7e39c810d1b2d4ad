"""Exports run in their own process, one at a time, queued and cancellable; the umask is read, never set."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from appliance.errors import ExportError
from appliance.export.exporter import _umask
from appliance.service.exports import MAX_WAITING, ExportCancelled, ExportRunner, ExportsBusy


def _start(
    runner: ExportRunner, job_id: str, tmp_path, outcome: dict, caller=None, done: list | None = None
) -> threading.Thread:
    def go() -> None:
        try:
            outcome[job_id] = runner.run(
                job_id, tmp_path / job_id, tmp_path, tmp_path / f"out-{job_id}", "best", True, "bfloat16", caller
            )
        except ExportError as error:
            outcome[job_id] = error
        if done is not None:
            done.append(job_id)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


def test_an_export_error_in_the_child_process_reaches_the_caller(tmp_path):
    with pytest.raises(ExportError) as raised:
        ExportRunner().run("nojob", tmp_path / "nojob", tmp_path, tmp_path / "out", "best", False, "bfloat16")
    assert not isinstance(raised.value, ExportCancelled)
    assert "nojob" in str(raised.value)


def test_exports_run_one_at_a_time_and_a_queued_or_running_one_can_be_cancelled(tmp_path):
    runner, outcome = ExportRunner(), {}
    first = _start(runner, "first", tmp_path, outcome)
    _until(lambda: "first" in runner._running)
    child = runner._running["first"]
    second = _start(runner, "second", tmp_path, outcome)
    _until(lambda: "second" in runner.waiting())
    assert "second" not in runner._running  # waits for the one export slot
    assert runner.cancel("second") is True
    assert runner.cancel("first") is True
    first.join(20)
    second.join(20)
    assert isinstance(outcome["first"], ExportCancelled) and "was cancelled" in str(outcome["first"])
    assert isinstance(outcome["second"], ExportCancelled) and "while it waited" in str(outcome["second"])
    assert child.returncode is not None and child.returncode < 0  # the process was killed, not left running
    assert runner.cancel("first") is False and runner._running == {} and runner.waiting() == {}


def test_waiting_exports_run_in_the_order_they_were_asked_for(tmp_path):
    runner, outcome, finished = ExportRunner(), {}, []
    names = ["first", "second", "third"]
    threads = []
    for name in names:
        threads.append(_start(runner, name, tmp_path, outcome, caller=name, done=finished))
        # It has its place in the line (waiting, running or already done) before the next one asks.
        _until(lambda: name in runner._running or name in runner.waiting() or name in finished)
    for thread in threads:
        thread.join(60)
    assert finished == names  # one at a time, so each ends before the next starts
    assert all(isinstance(outcome[name], ExportError) and name in str(outcome[name]) for name in names)


def test_a_cancel_reaches_every_export_of_the_job_asked_for_before_it_and_none_after(tmp_path):
    """Two callers wait to export the same job: one cancel drops both (a cancel used to reach only the first to
    come out of the line); an export of that job asked for after the cancel runs."""
    runner, outcome = ExportRunner(), {}
    ahead = _start(runner, "ahead", tmp_path, outcome)
    _until(lambda: "ahead" in runner._running)
    waiting = {caller: {} for caller in ("alice", "bob")}
    threads = [_start(runner, "shared", tmp_path, waiting[caller], caller=caller) for caller in waiting]
    _until(lambda: runner.waiting().get("shared") == 2)
    assert runner.cancel("shared") is True
    assert runner.cancel("ahead") is True  # still running: the two wait behind it
    late: dict = {}
    threads.append(_start(runner, "shared", tmp_path, late, caller="carol"))
    for thread in [ahead, *threads]:
        thread.join(60)
    assert isinstance(outcome["ahead"], ExportCancelled)
    for caller in waiting:
        assert isinstance(waiting[caller]["shared"], ExportCancelled), caller
        assert "while it waited" in str(waiting[caller]["shared"])
    assert isinstance(late["shared"], ExportError) and not isinstance(late["shared"], ExportCancelled)
    assert "no job" in str(late["shared"])  # it ran: the export process itself answered
    assert runner._cancelled_upto == {} and runner._running == {} and runner.waiting() == {} and not runner._busy


def test_an_export_that_has_ended_is_not_signalled_nor_called_cancelled():
    """The window between the runner waiting for its process and forgetting it: a cancel then must not signal
    the ended process's group id (the kernel may have given it to another process) nor turn a finished export's
    answer into "cancelled"."""
    runner = ExportRunner()
    ended = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    ended.wait()
    runner._running["done"] = ended
    assert runner.cancel("done") is False
    assert "done" not in runner._cancelled_upto


def test_an_export_past_the_waiting_ones_is_refused_with_429(tmp_path):
    runner, outcome = ExportRunner(), {}
    threads = [_start(runner, "running", tmp_path, outcome)]
    _until(lambda: "running" in runner._running)
    threads += [_start(runner, f"waiting{n}", tmp_path, outcome) for n in range(MAX_WAITING)]
    _until(lambda: sum(runner.waiting().values()) == MAX_WAITING)
    with pytest.raises(ExportsBusy) as refused:
        runner.run("one-more", tmp_path / "x", tmp_path, tmp_path / "out-x", "best", True, "bfloat16")
    assert refused.value.http_status == 429 and f"{MAX_WAITING} more wait" in str(refused.value)
    for name in [f"waiting{n}" for n in range(MAX_WAITING)] + ["running"]:
        assert runner.cancel(name) is True
    for thread in threads:
        thread.join(20)
    assert all(isinstance(outcome[name], ExportCancelled) for name in outcome) and len(outcome) == MAX_WAITING + 1
    assert runner._running == {} and runner.waiting() == {}


def test_one_caller_holds_one_place_in_the_export_queue_and_never_all_of_it(tmp_path):
    """The attack: one member keeps the slot running and fills every waiting place, so every other member's
    export is refused for as long as they like."""
    runner, outcome = ExportRunner(), {}
    alice, bob = ("uid", 4001), ("uid", 4002)
    threads = [_start(runner, "alice-1", tmp_path, outcome, alice)]
    _until(lambda: "alice-1" in runner._running)
    for job in ("alice-1", "alice-2"):  # the same job again, or another of hers: both refused while one is hers
        with pytest.raises(ExportsBusy, match="your export of job 'alice-1' is running or waiting"):
            runner.run(job, tmp_path / job, tmp_path, tmp_path / f"out-{job}", "best", True, "bfloat16", alice)
    threads.append(_start(runner, "bob-1", tmp_path, outcome, bob))
    _until(lambda: "bob-1" in runner.waiting())  # another caller still finds a place
    for name in ("bob-1", "alice-1"):
        assert runner.cancel(name) is True
    for thread in threads:
        thread.join(20)
    assert runner._by_caller == {} and runner.waiting() == {}  # her place is free again once it ended


def test_the_umask_is_read_without_being_set(monkeypatch):
    previous = os.umask(0o027)
    try:

        def refuse(mask):
            raise AssertionError("os.umask changes the mask of every thread")

        monkeypatch.setattr(os, "umask", refuse)
        assert _umask() == 0o027
    finally:
        monkeypatch.undo()
        os.umask(previous)


def test_an_export_copies_no_file_reached_through_a_link(tmp_path):
    """The attack: a model folder whose tokenizer files link to the administrator's 0600 secret."""
    from appliance.export.exporter import BaseModel, _copy_tokenizer

    secret = tmp_path / "judge.token"
    secret.write_text("the admin's token")
    secret.chmod(0o600)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").symlink_to(secret)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ExportError, match="is a link; an export copies only regular files"):
        _copy_tokenizer(BaseModel("m", folder, {}), out)
    assert not any("token" in path.read_text() for path in out.iterdir() if path.is_file())
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")  # a FIFO would block a plain copy for ever: it is passed over
    _copy_tokenizer(BaseModel("m", folder, {}), out)
    assert sorted(path.name for path in out.iterdir()) == ["tokenizer.json"]
