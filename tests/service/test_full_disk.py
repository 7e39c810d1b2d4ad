"""A real daemon whose data dir (job store, audit log, job folders, uploads) is on a full file system: it keeps
answering reads, refuses each write with a 507 that says what to free, stores nothing half-written, and takes
writes again once there is space. The file system is a real 8 MiB tmpfs (conftest.small_disk)."""

from __future__ import annotations

import pytest

from appliance.service.client import ClientError
from disk_support import fill_disk
from daemon_support import link_model_store, tiny_job

UPLOADED = tiny_job(steps=1000).replace(
    "  dataset: builtin:multiply\n  operand_min: 2\n  operand_max: 5\n  held_out: 4\n",
    "  dataset: data/train.jsonl\n  held_out: 1\n",
)
ROWS = '{"question": "What is 2 * 3?", "answer": "6"}\n' * 4


def refused(call) -> ClientError:
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value


def test_a_full_disk_keeps_reads_and_refuses_writes_with_what_to_free(small_disk, make_daemon, store_data_dir):
    daemon = make_daemon(data_dir=link_model_store(store_data_dir, small_disk / "data"))
    client = daemon.client()
    first = client.submit_text("first.yaml", tiny_job(steps=1000)).job
    assert client.cancel(first.id).state == "cancelled"
    jobs_before = sorted(path.name for path in (daemon.data_dir / "jobs").iterdir())
    filler = fill_disk(small_disk)

    assert client.status().jobs["cancelled"] == 1
    assert [job.id for job in client.jobs()] == [first.id]
    assert client.job(first.id).state == "cancelled"
    for _ in range(3):  # the same connection each time: a refusal is an answer, not a reset
        error = refused(lambda: client.submit_text("second.yaml", tiny_job(steps=1000)))
        assert error.status == 507, error
        assert "Free space" in str(error) and "nothing was submitted" in str(error)
    error = refused(lambda: client.submit_text("data.yaml", UPLOADED, {"data/train.jsonl": ROWS}))
    assert error.status == 507 and "upload" in str(error), error

    assert [job.id for job in client.jobs()] == [first.id]  # nothing half-stored
    assert sorted(path.name for path in (daemon.data_dir / "jobs").iterdir()) == jobs_before
    assert not any((daemon.data_dir / "uploads").iterdir())

    filler.unlink()
    second = client.submit_text("second.yaml", tiny_job(steps=1000)).job
    assert client.cancel(second.id).state == "cancelled"
    assert daemon.proc.poll() is None
