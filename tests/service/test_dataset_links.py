"""A dataset admitted as its resolved path is read through no link: a member who can write a folder on that path
and swaps it for a link to another folder while the job waits gets a failed job naming the link, never the
other folder's file. A real daemon and worker; the first job holds the only slot while the swap is made."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal

import pytest
from daemon_support import tiny_job, wait_for, worker_pids

from appliance.service.client import Client

pytestmark = pytest.mark.model

ROWS = "".join(json.dumps({"question": f"What is {a} * 3?", "answer": str(a * 3)}) + "\n" for a in range(2, 8))


def test_a_folder_swapped_for_a_link_after_admission_fails_the_job_not_read(make_daemon, tmp_path):
    daemon = make_daemon()
    admitted = daemon.data_dir / "datasets" / "alice"  # a folder its member may write
    elsewhere = tmp_path / "elsewhere" / "alice"  # readable by the daemon, outside its dataset roots
    for folder in (admitted, elsewhere):
        folder.mkdir(parents=True)
        (folder / "rows.jsonl").write_text(ROWS)
    job = tiny_job("linked", steps=1).replace(
        "  dataset: builtin:multiply\n  operand_min: 2\n  operand_max: 5\n  held_out: 4\n",
        "  dataset: alice/rows.jsonl\n  held_out: 1\n",
    )
    with Client(daemon.socket_path) as client:
        holder = client.submit_text("holder.yaml", tiny_job("holder", steps=1000)).job.id
        worker = wait_for(lambda: worker_pids(daemon.data_dir), 60, "the first job's worker")[0]
        os.killpg(os.getpgid(worker), signal.SIGSTOP)  # holds the only slot while the folder is swapped
        waiting = client.submit_text("linked.yaml", job).job
        assert waiting.state == "queued"
        shutil.rmtree(admitted)
        admitted.symlink_to(elsewhere)
        client.cancel(holder)
        with contextlib.suppress(ProcessLookupError):  # let a stopped worker see its cancel, if it is not gone yet
            os.killpg(worker, signal.SIGCONT)
        ended = wait_for(
            lambda: (detail := client.job(waiting.id)).state in ("failed", "done", "cancelled") and detail,
            240,
            "the linked job's end",
        )
    assert ended.state == "failed", ended
    assert "now goes through a link" in ended.reason and str(admitted) in ended.reason, ended.reason
