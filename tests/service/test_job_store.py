"""The job store: the transitions table, the append-only events, FIFO claims, persistence across reopen."""

from __future__ import annotations

import sqlite3

import pytest

from appliance.service.api import JOB_ID_PATTERN, JOB_STATES, TERMINAL_STATES
from appliance.service.job_store import TRANSITIONS, BadTransition, JobStore, UnknownJob

SPEC = {"name": "j", "student": {"model": "m"}, "grpo": {"steps": 3}}


@pytest.fixture
def store(tmp_path):
    handle = JobStore(tmp_path / "appliance.db")
    yield handle
    handle.close()


def submit(store: JobStore, name: str = "j"):
    return store.submit(name, uid=1000, user="alice", spec=SPEC, plan={"fits": True}, steps_total=3)


def test_submit_stores_a_queued_job_with_a_safe_id_and_a_first_event(store):
    job = submit(store)
    assert JOB_ID_PATTERN.fullmatch(job.id)
    assert (job.state, job.uid, job.user, job.steps_total) == ("queued", 1000, "alice", 3)
    row = store.get(job.id)
    assert row.spec == SPEC and row.plan == {"fits": True}
    [event] = store.events(0, job.id)
    assert (event.kind, event.data) == ("state", {"from": None, "to": "queued", "reason": "submitted"})


def test_every_transition_follows_the_table(store):
    for source in JOB_STATES:
        for target in JOB_STATES:
            job = submit(store)
            path = {
                "queued": [],
                "running": ["running"],
                "paused": ["paused"],
                "interrupted": ["running", "interrupted"],
                "succeeded": ["running", "succeeded"],
                "failed": ["running", "failed"],
                "cancelled": ["cancelled"],
            }[source]
            for step in path:
                store.transition(job.id, step)
            if target in TRANSITIONS[source]:
                assert store.transition(job.id, target, "why").state == target
            else:
                with pytest.raises(BadTransition, match=f"is {source}; it cannot become {target}"):
                    store.transition(job.id, target)
                assert store.get(job.id).summary.state == source


def test_terminal_states_move_nowhere():
    assert all(not TRANSITIONS[state] for state in TERMINAL_STATES)


def test_transitions_append_events_with_reasons_in_order(store):
    job = submit(store)
    store.transition(job.id, "running", "started on slot 0")
    store.transition(job.id, "interrupted", "worker died")
    store.transition(job.id, "running", "restarted")
    store.transition(job.id, "succeeded", "done")
    events = store.events(0, job.id, kinds=("state",))
    assert [(e.data["from"], e.data["to"], e.data["reason"]) for e in events] == [
        (None, "queued", "submitted"),
        ("queued", "running", "started on slot 0"),
        ("running", "interrupted", "worker died"),
        ("interrupted", "running", "restarted"),
        ("running", "succeeded", "done"),
    ]
    assert [e.id for e in events] == sorted(e.id for e in events)


def test_claim_next_is_fifo_and_skips_jobs_that_are_not_queued(store):
    first, second, third = submit(store, "a"), submit(store, "b"), submit(store, "c")
    store.transition(second.id, "paused", "by hand")
    assert store.claim_next(0).id == first.id
    assert store.claim_next(1).id == third.id
    assert store.claim_next(2) is None
    assert store.get(third.id).summary.slot == 1


def test_events_after_a_cursor_and_listeners(store):
    seen = []
    store.listeners.append(seen.append)
    job = submit(store)
    cursor = store.last_event_id()
    store.add_event(job.id, "step", {"step": 1, "reward_mean": 0.5}, step=1)
    store.add_event(job.id, "log", {"line": "hello"}, step=1)
    later = store.events(cursor)
    assert [e.kind for e in later] == ["step", "log"]
    assert store.get(job.id).summary.step == 1
    assert seen == list(range(seen[0], seen[0] + 3))


def test_unknown_job(store):
    with pytest.raises(UnknownJob, match="no job 'abcdef0123'"):
        store.transition("abcdef0123", "running")


def test_the_store_survives_a_reopen_and_uses_wal(tmp_path):
    store = JobStore(tmp_path / "appliance.db")
    job = submit(store)
    store.transition(job.id, "running")
    store.close()
    reopened = JobStore(tmp_path / "appliance.db")
    assert reopened.get(job.id).summary.state == "running"
    assert reopened.counts()["running"] == 1
    reopened.close()
    mode = sqlite3.connect(tmp_path / "appliance.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
