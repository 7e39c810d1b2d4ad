"""A daemon whose job holds the largest judge log rotation allows: pages are capped, /status stays fast."""

from __future__ import annotations

import json
import threading
import time

import pytest

from daemon_support import Daemon, daemon_env, free_port, link_model_store, short_tmp_dir, tiny_job
from service_latency import percentile

JUDGE_LOG_BYTES = 64 * 1024 * 1024  # judge.log_max_bytes' default: the live file never grows past it


@pytest.fixture(scope="module")
def busy(tmp_path_factory, store_data_dir):
    data_dir = link_model_store(store_data_dir, tmp_path_factory.mktemp("busy") / "data")
    server = Daemon(
        data_dir,
        short_tmp_dir() / "control.sock",
        free_port(),
        tmp_path_factory.mktemp("log") / "d.log",
        [],
        daemon_env(),
    )
    server.start()
    client = server.client()
    job = client.submit_text("busy.yaml", tiny_job(steps=1000)).job
    client.cancel(job.id)
    server.wait_state(job.id, "cancelled", timeout=120)
    job_dir = server.data_dir / "jobs" / job.id
    line = json.dumps({"outcome": "ok", "prompt": "p" * 400, "reply": "r" * 400}) + "\n"
    with open(job_dir / "judge.jsonl", "w") as handle:
        handle.write(line * (JUDGE_LOG_BYTES // len(line)))
        handle.write(json.dumps({"outcome": "rare", "n": 1}) + "\n")
    with open(job_dir / "metrics.jsonl", "w") as handle:
        for step in range(1, 200001):
            handle.write(json.dumps({"step": step, "loss": 0.5}) + "\n")
    yield server, job.id
    server.close()


def test_huge_limits_return_one_capped_page(busy):
    server, job_id = busy
    client = server.client()
    assert len(client.judge_log(job_id, limit=10**12).records) == 1000
    assert client.judge_log(job_id, outcome="rare", limit=10**12).records == [{"outcome": "rare", "n": 1}]
    assert len(client.metrics(job_id, limit=10**12).records) == 10000
    assert client.job(job_id).last_record == {"step": 200000, "loss": 0.5}


@pytest.mark.serial  # times the daemon's answers: alone on the box
def test_status_stays_fast_while_12_clients_page_the_judge_log(busy):
    server, job_id = busy
    stop = threading.Event()
    pages = []

    def page(outcome):  # a filter that matches nothing scans the whole byte cap; none parses 1000 lines
        with server.client(timeout=60) as client:
            while not stop.is_set():
                pages.append(len(client.judge_log(job_id, outcome=outcome, limit=1000).records))

    readers = [threading.Thread(target=page, args=("missing" if n % 2 else None,)) for n in range(12)]
    for reader in readers:
        reader.start()
    times = []
    try:
        with server.client() as client:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                began = time.perf_counter()
                client.status()
                times.append(time.perf_counter() - began)
                time.sleep(0.02)
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    p99 = percentile(times, 0.99)
    print(f"/status p99 {p99 * 1000:.1f} ms over {len(times)} requests; {len(pages)} judge pages read meanwhile")
    assert pages and len(times) > 50
    assert p99 < 0.25


def test_show_and_metrics_read_a_bounded_part_of_a_huge_metrics_file(busy):
    server, job_id = busy
    path = server.data_dir / "jobs" / job_id / "metrics.jsonl"
    kept = path.with_name("metrics.kept")
    path.rename(kept)
    try:
        with open(path, "wb") as handle:  # 1 GiB of one line without a newline (sparse), then a record
            handle.truncate(1 << 30)
            handle.seek(1 << 30)
            handle.write(b'\n{"step": 7, "loss": 0.25}\n')
        before = rss_kib(server.proc.pid)
        client = server.client()
        started = time.monotonic()
        assert client.job(job_id).last_record == {"step": 7, "loss": 0.25}  # read from the end
        assert client.metrics(job_id, limit=10**12).records == []  # the record is past the scan cap
        assert time.monotonic() - started < 1.0
        assert rss_kib(server.proc.pid) - before < 100 * 1024
    finally:
        path.unlink()
        kept.rename(path)


def test_metrics_pages_reach_the_newest_steps_of_a_file_past_the_scan_cap(busy):
    server, job_id = busy
    path = server.data_dir / "jobs" / job_id / "metrics.jsonl"
    kept = path.with_name("metrics.kept")
    path.rename(kept)
    try:
        with open(path, "w") as handle:  # 24 MiB, well past the 16 MiB a request may read
            for step in range(1, 200001):
                handle.write(json.dumps({"step": step, "note": "n" * 100}) + "\n")
        assert path.stat().st_size > 20 * 1024 * 1024
        client = server.client()
        started = time.monotonic()
        page = client.metrics(job_id, after_step=199990, limit=1000)
        assert [row["step"] for row in page.records] == list(range(199991, 200001))
        assert page.next_after_step is None
        middle = client.metrics(job_id, after_step=120000, limit=5)
        assert [row["step"] for row in middle.records] == [120001, 120002, 120003, 120004, 120005]
        assert middle.next_after_step == 120005
        assert time.monotonic() - started < 1.0
    finally:
        path.unlink()
        kept.rename(path)


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_the_tui_feeds_fetch_only_the_steps_after_the_last_they_have(busy):
    from tui.feeds import HistoriesFeed, JobFeed

    server, job_id = busy
    path = server.data_dir / "jobs" / job_id / "metrics.jsonl"
    kept = path.with_name("metrics.kept")
    path.rename(kept)
    try:
        path.write_text("".join(step_line(step, 0.5) for step in (1, 2, 3)))
        client = server.client()
        job, compare = JobFeed(client, job_id), HistoriesFeed(client, [job_id])
        assert [record.step for record in job.poll()[1].records] == [1, 2, 3]
        assert [record.loss for record in compare.poll().histories[job_id]] == [0.5, 0.5, 0.5]
        # Step 1 rewritten and step 4 appended: a feed that fetched everything again would show the new loss.
        path.write_text("".join(step_line(step, 0.25) for step in (1, 2, 3, 4)))
        job.wakeup.cursor = None  # ask at once instead of waiting on the events long-poll
        assert [record.step for record in job.poll()[1].records] == [4]
        assert [record.loss for record in compare.poll().histories[job_id]] == [0.5, 0.5, 0.5, 0.25]
    finally:
        path.unlink()
        kept.rename(path)


STEP_NUMBERS = (
    "time reward_mean reward_std kl clip_ratio grad_norm learning_rate groups_informative groups_total "
    "trained_sequences trained_tokens micro_batch_size completions completion_length_mean completion_length_max"
).split()


def step_line(step: int, loss: float) -> str:
    """One metrics.jsonl line the TUI reads as a StepRecord."""
    return json.dumps({"step": step, "loss": loss, **dict.fromkeys(STEP_NUMBERS, 0)}) + "\n"
