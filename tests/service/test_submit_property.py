"""Property: any submission, of any size or shape, dry run or real, is answered 2xx or 4xx within its time bound,
never 5xx, and the daemon's memory stays bounded (Hypothesis against a real daemon over its socket)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon_support import Daemon, daemon_env, free_port, link_model_store, short_tmp_dir, tiny_job, unix_request

EXAMPLES = 150
TIME_BOUND_SECONDS = 5.0  # a check's own bound is 60 s; these files are small
SEEN: list[tuple[int, float]] = []


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store_data_dir):
    data_dir = link_model_store(store_data_dir, tmp_path_factory.mktemp("property") / "data")
    folder = short_tmp_dir()
    server = Daemon(
        data_dir, folder / "control.sock", free_port(), tmp_path_factory.mktemp("log") / "daemon.log", [], daemon_env()
    )
    server.start()
    unix_request(server.socket_path, "POST", "/jobs", {"file_name": "warm.yaml", "yaml": tiny_job(), "dry_run": True})
    server.rss_at_start = rss_kib(server.proc.pid)
    yield server
    server.close()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


TEXT = st.text(st.characters(codec=None), max_size=60)
SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**40), 10**40), st.floats(allow_nan=True, allow_infinity=True), TEXT
)
VALUE = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5), max_leaves=25
)
BASE_LINES = tiny_job().splitlines()


@st.composite
def job_files(draw) -> str:
    """A job file: the tiny job with one line replaced by any YAML value at any indentation, any text, any JSON
    value, or a repetition that runs to the size cap."""
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "text", "json", "huge"]))
    if kind == "valid":  # in bounds: these get through (a dry run's plan, or a queued job)
        steps = draw(st.integers(1, 1_000_000))
        return tiny_job(draw(st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)), steps=steps)
    if kind == "text":
        return draw(st.text(max_size=2000))
    if kind == "json":
        return json.dumps(draw(VALUE))
    if kind == "huge":
        line = draw(st.sampled_from(BASE_LINES))
        return "\n".join(BASE_LINES) + "\n" + (line + "\n") * draw(st.integers(1, 30_000))
    lines = list(BASE_LINES)
    at = draw(st.integers(0, len(lines) - 1))
    key = lines[at].split(":")[0]
    lines[at] = f"{key}: {json.dumps(draw(VALUE))}"
    return "\n".join(lines) + "\n"


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    text=job_files(),
    dry_run=st.sampled_from([True, True, True, False]),
    file_name=TEXT,
    upload=st.none() | st.tuples(TEXT, st.text(max_size=500)),
)
def test_any_submission_is_answered_2xx_or_4xx_in_time(daemon, text, dry_run, file_name, upload):
    body = {"file_name": file_name, "yaml": text, "dry_run": dry_run, "uploads": dict([upload]) if upload else {}}
    started = time.monotonic()
    status, answer = unix_request(daemon.socket_path, "POST", "/jobs", body)
    seconds = time.monotonic() - started
    SEEN.append((status, seconds))
    assert status < 500, answer
    assert seconds < TIME_BOUND_SECONDS, f"{seconds:.1f} s for a {len(text)}-character file"
    if status == 201:  # a real job got through: it runs no further than its cancel
        unix_request(daemon.socket_path, "POST", f"/jobs/{answer['job']['id']}/cancel")


def test_the_daemon_lived_through_it_in_bounded_memory(daemon):
    assert len(SEEN) >= EXAMPLES, "run with the property test before it"
    growth = rss_kib(daemon.proc.pid) - daemon.rss_at_start
    statuses = sorted({status for status, _ in SEEN})
    print(
        f"{len(SEEN)} generated submissions: statuses {statuses}, slowest {max(s for _, s in SEEN):.2f} s, "
        f"daemon RSS grew {growth / 1024:.1f} MiB"
    )
    assert daemon.proc.poll() is None and growth < 64 * 1024
    assert unix_request(daemon.socket_path, "GET", "/status")[0] == 200
