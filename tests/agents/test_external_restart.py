"""An external-rollout job's worker restarts: nothing accepted is lost, the ledger still checks, token and port stay.

A real endpoint over a tiny random Llama (the bundled tokenizer) serves the
calculator environment played through the `openai` client; a second
ExternalSource over the same job folder is the restarted worker. The crash is
simulated at the process boundary only: the dead worker's server socket and
file handles are released (the kernel would do it) and nothing else runs, so
the job folder is exactly what a killed worker leaves.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import httpx
import pytest

from appliance.agents.endpoint_file import SUBMIT_ROUTE, read_endpoint_file
from appliance.agents.external_source import ExternalSource
from appliance.paths import served_ledger_file, submitted_groups_dir

pytestmark = pytest.mark.model


@pytest.fixture
def start(tiny_engine):
    """Start ExternalSources (workers) over job folders; every one is closed at the end, even when the test fails."""
    started: list[ExternalSource] = []

    def starter(job_dir: Path) -> ExternalSource:
        # Everything here is served at step 1 and trained up to step 3: a staleness bound that lets it through.
        source = ExternalSource(
            tiny_engine, job_dir, group_size=2, served_name="student", max_queued_groups=8, max_staleness=2
        )
        started.append(source)
        return source

    yield starter
    for source in started:
        if not source.server.server.should_exit:
            source.close()


def crash(source: ExternalSource) -> None:
    """What a killed worker leaves behind: its files as they are; only its socket and descriptors are released."""
    source.service.open = False
    source.server.close(timeout_seconds=30)
    source.ledger.close()


def play(source: ExternalSource, groups: int, tmp_path: Path) -> list[dict]:
    """Play `groups` calculator groups against the endpoint (a collect holds the model open meanwhile)."""
    from appliance.agents.environment import rollout_groups
    from appliance.agents.environment_loader import load_environment
    from appliance.agents.openai_client import OpenAIChatClient

    environment = load_environment("builtin:calculator", tmp_path, {})
    environment.max_turns = 2

    async def rollouts():
        client = OpenAIChatClient(source.url, source.token, "student", max_tokens=8)
        try:
            return await rollout_groups(environment, client, environment.scenarios("train", groups, seed=3), 2)
        finally:
            await client.close()

    return [group.model_dump(mode="json") for group in asyncio.run(rollouts())]


def submit(source: ExternalSource, groups: list) -> httpx.Response:
    return httpx.post(
        source.url.removesuffix("/v1") + SUBMIT_ROUTE,
        json={"groups": groups},
        timeout=120,
        headers={"Authorization": f"Bearer {source.token}"},
    )


def unstamped(group) -> dict:
    """A collected group as the client submitted it: without what the ledger stamped (when it was served)."""
    dump = group.model_dump(mode="json")
    for trajectory in dump["trajectories"]:
        assert trajectory["metadata"].pop("served_step") == 1
        trajectory["metadata"].pop("served_sampling")
        trajectory["metadata"].pop("unserved_messages_dropped", None)
    return dump


def as_kept(group: dict) -> dict:
    """A submitted group as the ledger keeps it: each trajectory up to its last served (assistant) turn."""
    copy = json.loads(json.dumps(group))
    for trajectory in copy["trajectories"]:
        messages = trajectory["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        trajectory["messages"] = messages[: last + 1]
    return copy


def forged(group: dict) -> dict:
    copy = json.loads(json.dumps(group))
    trajectory = copy["trajectories"][0]
    turn = next(m for m in trajectory["messages"][trajectory["context_messages"] :] if m["role"] == "assistant")
    turn["sampled"]["token_ids"][0] = (turn["sampled"]["token_ids"][0] + 1) % 1000
    return copy


def test_a_restarted_worker_keeps_queued_groups_and_checks_what_the_dead_one_served(start, tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    first = start(job_dir)
    box: dict = {}
    opened = threading.Thread(target=lambda: box.setdefault("step1", first.collect(1, 1, 2)), daemon=True)
    opened.start()  # the trainer's first collect opens the model to chat requests
    played = play(first, 3, tmp_path)
    assert submit(first, played[:1]).status_code == 200
    opened.join(60)
    assert [unstamped(g) for g in box["step1"]] == [as_kept(g) for g in played[:1]]  # step 1 took it, then...
    accepted = submit(first, played[1:2])
    assert accepted.status_code == 200 and accepted.json()["queued"] == 1
    # ...the worker dies before step 1 is checkpointed; played[2] was served and never submitted
    crash(first)
    assert sorted(p.name for p in submitted_groups_dir(job_dir).iterdir()) == [
        "000000000000.step-000001.json",
        "000000000001.json",
    ]

    second = start(job_dir)
    assert (second.token, second.url) == (first.token, first.url)  # same job: same token, the port was free
    assert read_endpoint_file(job_dir) == {
        "url": first.url,
        "local_url": first.url,
        "token": first.token,
        "model": "student",
        "pid": os.getpid(),
    }
    assert second.queued == 2  # both accepted groups are back (checked first: collect would wait for them)
    # resumed at step 0 (no checkpoint): step 1 trains the same group again, then the queued one
    assert [unstamped(g) for g in second.collect(1, 1, 2)] == [as_kept(g) for g in played[:1]]
    second.checkpointed(1)
    assert sorted(p.name for p in submitted_groups_dir(job_dir).iterdir()) == ["000000000001.json"]

    refused = submit(second, [forged(played[2])])
    assert refused.status_code == 422 and "not served by this job's endpoint" in refused.json()["error"]["message"]
    again = submit(second, played[:1])
    assert again.status_code == 422 and "already submitted" in again.json()["error"]["message"]
    late = submit(second, played[2:])  # served by the dead worker, checked by this one
    assert late.status_code == 200, late.text
    assert [unstamped(g) for g in second.collect(2, 1, 2)] == [as_kept(g) for g in played[1:2]]
    assert [unstamped(g) for g in second.collect(3, 1, 2)] == [as_kept(g) for g in played[2:]]
    second.checkpointed(3)
    assert list(submitted_groups_dir(job_dir).iterdir()) == []

    second.close()  # a pause: not serving, but the token and port are kept for the resumed worker
    assert read_endpoint_file(job_dir) is None
    third = start(job_dir)
    assert (third.token, third.url) == (first.token, first.url)
    assert third.queued == 0
    assert submit(third, played[2:]).status_code == 422  # used before two restarts: still used
    (tmp_path / "another-job").mkdir()
    other = start(tmp_path / "another-job")
    assert other.token != first.token and other.url != first.url
    assert os.stat(served_ledger_file(job_dir)).st_mode & 0o777 == 0o600
