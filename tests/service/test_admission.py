"""Admission is cheap and bounded for the daemon whatever the caller writes: checks run in killable child
processes, one per caller, and what the issue's attacker sent is refused in milliseconds with a 422 naming the
key; the daemon's answers never wait behind a check."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from daemon_support import as_user, can_switch_users, open_socket_dir, tiny_job, unix_request, wait_for

MEMBERS, ALICE = 4000, 4001


def dry_run(daemon, text: str, uploads: dict | None = None) -> tuple[int, dict]:
    body = {"file_name": "job.yaml", "yaml": text, "dry_run": True, "uploads": uploads or {}}
    return unix_request(daemon.socket_path, "POST", "/jobs", body)


def check_children(daemon) -> list[int]:
    """The check processes: children of the daemon's forkserver."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            grandparent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if grandparent == daemon.proc.pid and b"forkserver" in Path(f"/proc/{parent}/cmdline").read_bytes():
            found.append(int(entry.name))
    return found


def big_upload(rows: int) -> tuple[str, dict]:
    text = tiny_job("uploaded").replace("dataset: builtin:multiply", "dataset: rows.jsonl")
    text = text.replace("  operand_min: 2\n  operand_max: 5\n", "")
    data = "".join(json.dumps({"question": f"What is {n} + 1?", "answer": str(n + 1)}) + "\n" for n in range(rows))
    return text, {"rows.jsonl": data}


def test_what_the_attacker_sent_is_refused_in_milliseconds(make_daemon):
    daemon = make_daemon()
    dry_run(daemon, tiny_job())  # the first check may wait for the forkserver's imports
    cases = {
        "task.operand_max": tiny_job().replace("operand_max: 5", "operand_max: 20000"),
        "grpo.steps": tiny_job(steps=10**9),
        "checkpoint.keep_last": tiny_job().replace("keep_last: 2", "keep_last: 1000000000"),
        "grpo.group_size": tiny_job().replace("group_size: 2", "group_size: 1000000"),
    }
    cases["task.system_prompt"] = tiny_job().replace(
        "  held_out: 4\n", '  held_out: 4\n  system_prompt: "\\e]2;x\\a"\n'
    )
    for key, text in cases.items():
        started = time.monotonic()
        status, answer = dry_run(daemon, text)
        assert status == 422, (key, answer)
        assert time.monotonic() - started < 2.0
        assert any(error["key"].startswith(key.rsplit(".", 1)[0]) for error in answer["errors"]), (key, answer)
    status, answer = dry_run(daemon, tiny_job(steps=10**30))  # once a 500 from SQLite
    assert status == 422 and answer["errors"][0]["key"] == "grpo.steps"
    assert daemon.client().status().jobs["queued"] == 0


def test_a_model_folder_outside_the_store_is_refused_in_one_sentence(make_daemon):
    daemon = make_daemon()
    for model in ("/etc", "/nonexistent/model", "../models/x", "~root/model", "/proc/self/root/etc"):
        status, answer = dry_run(daemon, tiny_job().replace("model: smollm2-135m-instruct", f"model: {model}"))
        assert status == 422
        [error] = answer["errors"]
        assert error["key"] == "student.model" and error["message"].startswith("student.model must name a model in")
        assert model in error["message"] and "does not exist" not in error["message"]
        assert "no config" not in error["message"]


def test_a_check_killed_mid_way_is_a_422_and_the_daemon_answers_on(make_daemon):
    daemon = make_daemon()
    text, uploads = big_upload(400_000)  # about 20 MB of rows: counting them takes a while
    answer: dict = {}
    submitter = threading.Thread(target=lambda: answer.update(result=dry_run(daemon, text, uploads)))
    submitter.start()
    children = wait_for(lambda: check_children(daemon), 60, "the check's child process", interval=0.02)
    for pid in children:
        os.kill(pid, signal.SIGKILL)  # what the OOM killer or the CPU limit does to a check that grows
    submitter.join(120)
    status, body = answer["result"]
    assert status == 422 and "could not be checked within the daemon's bounds" in body["error"], body
    assert daemon.client().status().version
    assert daemon.proc.poll() is None
    assert not list((daemon.data_dir / "uploads").glob(".incoming-*")), "the spooled body was left behind"


@pytest.mark.serial  # times the daemon's answers: alone on the box
@pytest.mark.skipif(not can_switch_users(), reason="a second caller needs another uid")
def test_one_check_at_a_time_per_caller_and_status_never_waits_behind_them(make_daemon):
    daemon = make_daemon(["--group", str(MEMBERS)])
    open_socket_dir(daemon, MEMBERS)
    text, uploads = big_upload(200_000)
    results: dict = {}
    first = threading.Thread(target=lambda: results.update(first=dry_run(daemon, text, uploads)))
    first.start()
    wait_for(lambda: check_children(daemon), 60, "the first check", interval=0.02)
    second = dry_run(daemon, tiny_job())  # the same caller (root), while its first is being checked
    assert second[0] == 429 and "still being handled" in second[1]["error"]
    other = as_user(
        ALICE,
        ALICE,
        (MEMBERS,),
        unix_request,
        str(daemon.socket_path),
        "POST",
        "/jobs",
        {"file_name": "a.yaml", "yaml": tiny_job(), "dry_run": True},
    )
    assert other[0] == 200, other  # another caller is not held up by it
    started = time.monotonic()
    for _ in range(20):
        assert unix_request(daemon.socket_path, "GET", "/status")[0] == 200
    assert (time.monotonic() - started) / 20 < 0.1
    first.join(120)
    assert results["first"][0] == 200, results["first"]


def trickle_body(socket_path: str, seconds: float) -> float:
    """A submission whose body comes a byte every 0.2 s for `seconds`, then the connection is dropped."""
    import socket as sockets

    with sockets.socket(sockets.AF_UNIX) as sock:
        sock.connect(socket_path)
        sock.sendall(
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sock.sendall(b" ")
            time.sleep(0.2)
    return seconds


@pytest.mark.skipif(not can_switch_users(), reason="acting as other uids needs root")
def test_bodies_still_arriving_hold_no_check(make_daemon):
    """Two members trickle a submission each: before, their bodies held both checks (spooled inside the check's
    slot) and a third member's 60 ms dry run waited as long as they kept sending (38 s measured, up to 120 s)."""
    daemon = make_daemon(["--group", str(MEMBERS)])
    open_socket_dir(daemon, MEMBERS)
    socket_path = str(daemon.socket_path)
    slow = [
        threading.Thread(target=as_user, args=(uid, uid, (MEMBERS,), trickle_body, socket_path, 8.0))
        for uid in (ALICE + 1, ALICE + 2)
    ]
    for thread in slow:
        thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    answer = as_user(
        ALICE,
        ALICE,
        (MEMBERS,),
        unix_request,
        socket_path,
        "POST",
        "/jobs",
        {"file_name": "a.yaml", "yaml": tiny_job(), "dry_run": True},
    )
    waited = time.monotonic() - started
    for thread in slow:
        thread.join(30)
    assert answer[0] == 200, answer
    assert waited < 5.0, f"a dry run waited {waited:.1f} s behind bodies still arriving"


def test_a_layout_auto_resolves_to_that_the_runtime_does_not_deliver_is_a_422(make_daemon):
    """rollout: auto is transformers on this CPU daemon, so tensor_parallel_size would be ignored: refused at its key
    when planned on the daemon's device, as `appliance plan` refuses it."""
    daemon = make_daemon()
    text = tiny_job(extra="engine: {vllm: {tensor_parallel_size: 2}}\nresources: {gpus: 2}\n")
    text = text.replace("prompts_per_step: 1", "prompts_per_step: 2")
    status, answer = dry_run(daemon, text)
    assert status == 422, answer
    [error] = answer["errors"]
    assert error["key"] == "engine.vllm.tensor_parallel_size" and "auto is transformers" in error["message"]
