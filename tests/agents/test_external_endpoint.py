"""The student endpoint of an external-rollout job, over a real engine, played by an agent in another process.

The agent (tests/agents/external_agent.py) uses the `openai` package to play
builtin:calculator against the endpoint; its groups pass the served-token
check and come out of `collect`, forged ones are refused with where they
are, chat requests wait while the trainer holds the model, and the token is
required. A tiny random Llama with the bundled tokenizer keeps it to seconds.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from appliance.agents.endpoint_file import ENDPOINT_FILE, SUBMIT_ROUTE, read_endpoint_file
from appliance.agents.external_source import ExternalSource
from appliance.engines.engine import Completion
from appliance.engines.openai_server import SamplingPolicy

pytestmark = pytest.mark.model

AGENT = Path(__file__).with_name("external_agent.py")
REPO_ROOT = AGENT.parent.parent.parent


@pytest.fixture
def source(tiny_engine, tmp_path):
    source = ExternalSource(
        tiny_engine, tmp_path, group_size=2, served_name="student", max_queued_groups=2, policy=SamplingPolicy(1.0, 1.0)
    )
    yield source
    source.close()


def run_agent(source: ExternalSource, out: Path, seed: int = 0) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            str(AGENT),
            "--url",
            source.url,
            "--token",
            source.token,
            "--model",
            "student",
            "--out",
            str(out),
            "--max-tokens",
            "8",
            "--seed",
            str(seed),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def submit(source: ExternalSource, groups: list, token: str | None = None) -> httpx.Response:
    base = source.url.removesuffix("/v1")
    return httpx.post(
        base + SUBMIT_ROUTE,
        json={"groups": groups},
        timeout=120,
        headers={"Authorization": f"Bearer {token or source.token}"},
    )


def collect_in_thread(source: ExternalSource, step: int, scenarios: int) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def trainer() -> None:
        try:
            box["groups"] = source.collect(step, scenarios, 2)
        except Exception as error:  # surfaced by the test
            box["error"] = error

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    return thread, box


def test_an_external_agent_plays_and_its_groups_are_collected(source, tmp_path):
    document = read_endpoint_file(tmp_path)
    assert document == {
        "url": source.url,
        "local_url": source.url,  # on loopback (the default) clients and the daemon use the same address
        "token": source.token,
        "model": "student",
        "pid": document["pid"],
    }
    assert stat.S_IMODE((tmp_path / ENDPOINT_FILE).stat().st_mode) == 0o600
    assert source.url.startswith("http://127.0.0.1:")
    # Hex, so never a leading '-' that `--token VALUE` would take for an option (a CI run drew one, 2026-11-27).
    assert re.fullmatch(r"[0-9a-f]{64}", source.token)

    thread, box = collect_in_thread(source, 1, 1)
    played = run_agent(source, tmp_path / "played.json")
    groups = played["groups"]
    assert len(groups) == 1 and len(groups[0]["trajectories"]) == 2
    # the worked examples (the first context_messages) are context: every turn after them was served
    turns = [
        m for t in groups[0]["trajectories"] for m in t["messages"][t["context_messages"] :] if m["role"] == "assistant"
    ]
    assert turns and all(turn["sampled"]["token_ids"] and turn["sampled"]["prompt_token_ids"] for turn in turns)
    # the tools were described in the prompt the endpoint rendered, as in process
    assert "<tools>" in source.service.engine.tokenizer.decode(turns[0]["sampled"]["prompt_token_ids"])
    assert len(played["latencies"]) == len(turns)

    forged = json.loads(json.dumps(groups))
    forged_trajectory = forged[0]["trajectories"][1]
    first = next(
        m for m in forged_trajectory["messages"][forged_trajectory["context_messages"] :] if m["role"] == "assistant"
    )
    first["sampled"]["token_ids"][0] = (first["sampled"]["token_ids"][0] + 1) % 1000
    refused = submit(source, forged)
    assert refused.status_code == 422
    assert (
        "group 0" in refused.json()["error"]["message"]
        and "trajectory 1, assistant turn 0" in refused.json()["error"]["message"]
    )
    assert "not served by this job's endpoint" in refused.json()["error"]["message"]
    assert source.accepted_total == 0 and "groups" not in box

    assert submit(source, groups, token="wrong").status_code == 401
    accepted = submit(source, groups)
    assert accepted.status_code == 200, accepted.text
    # the ledger wrote when and how each trajectory's turns were served (the client's say replaced), and
    # left out what came after the last served turn (a tool result the turn limit cut off)
    dropped = 0
    for group in groups:
        for trajectory in group["trajectories"]:
            messages = trajectory["messages"]
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            dropped += len(messages) - last - 1
            trajectory["messages"] = messages[: last + 1]
            trajectory["metadata"].update(served_step=1, served_sampling={"temperature": 1.0, "top_p": 1.0})
            if len(messages) > last + 1:
                trajectory["metadata"]["unserved_messages_dropped"] = len(messages) - last - 1
    assert accepted.json() == {"accepted": 1, "queued": 1, "step": 1, "unserved_messages_dropped": dropped}
    thread.join(30)
    assert "error" not in box
    collected = box["groups"]
    assert [g.model_dump(mode="json") for g in collected] == groups
    again = submit(source, groups)
    assert again.status_code == 422 and "already submitted" in again.json()["error"]["message"]


def test_chat_waits_while_the_trainer_holds_the_model(source):
    """Between collects (the update) a chat request waits; it is answered once the next collect opens."""
    answered: dict = {}

    def ask() -> None:
        answered["response"] = httpx.post(
            source.url + "/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {source.token}"},
            json={"model": "student", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        answered["at"] = time.monotonic()

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    time.sleep(2.0)
    assert "response" not in answered  # the trainer holds the model until its first collect
    opened = time.monotonic()
    thread, box = collect_in_thread(source, 1, 1)
    asker.join(60)
    assert answered["response"].status_code == 200 and answered["at"] >= opened
    body = answered["response"].json()
    assert body["choices"][0]["message"]["role"] == "assistant" and body["model"] == "student"
    source.close()  # a collect waiting for groups is released by closing; nothing more is served
    thread.join(30)
    assert not thread.is_alive() and "the source was closed" in str(box["error"])
    assert read_endpoint_file(Path(source.endpoint_file).parent) is None


def test_tool_calls_come_back_in_the_openai_shape(source):
    text = 'Let me compute. <tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'
    completion = Completion(
        prompt_index=0,
        prompt_token_ids=[1, 2, 3],
        token_ids=[4, 5],
        text=text,
        logprobs=[-0.1, -0.2],
        finish_reason="stop",
    )
    extra = source.service.hooks.reply([1, 2, 3], completion, "call_x_0")
    assert extra["finish_reason"] == "tool_calls"
    assert extra["message"]["tool_calls"] == [
        {
            "id": "call_x_0_1",
            "type": "function",
            "function": {"name": "multiply", "arguments": json.dumps({"a": 12, "b": 34})},
        }
    ]
    assert len(source.ledger) == 1  # what was served is on record
    rendered = source.service.hooks.template(
        [
            {"role": "user", "content": "What is 12 * 34?"},
            {"role": "assistant", "content": text, "tool_calls": extra["message"]["tool_calls"]},
            {"role": "tool", "tool_call_id": "call_x_0_1", "content": "408"},
        ],
        [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}],
    )
    assert rendered[0]["role"] == "system" and "<tools>" in rendered[0]["content"]
    assert rendered[2] == {"role": "assistant", "content": text} and rendered[3] == {"role": "tool", "content": "408"}


def test_a_cut_turn_with_whole_tool_calls_still_says_it_was_cut(source):
    text = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call> and then I will'
    completion = Completion(
        prompt_index=0,
        prompt_token_ids=[1, 2],
        token_ids=[4, 5, 6],
        text=text,
        logprobs=[-0.1] * 3,
        finish_reason="length",
    )
    extra = source.service.hooks.reply([1, 2], completion, "call_y_0")
    assert extra["finish_reason"] == "length" and len(extra["message"]["tool_calls"]) == 1
    (served,) = source.ledger._entries.values()
    assert served.finish_reason == "length"  # what the ledger writes over a submitted "stop"


def test_the_endpoint_serves_no_more_than_the_jobs_bound(tiny_engine, tmp_path):
    bounded = ExternalSource(
        tiny_engine, tmp_path, group_size=2, served_name="student", policy=SamplingPolicy(1.0, 1.0, max_tokens=3)
    )
    try:
        thread, box = collect_in_thread(bounded, 1, 1)  # the trainer's collect opens the endpoint
        reply = httpx.post(
            bounded.url + "/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {bounded.token}"},
            json={"model": "student", "max_tokens": 64, "messages": [{"role": "user", "content": "Count to fifty."}]},
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["usage"]["completion_tokens"] <= 3
        (served,) = bounded.ledger._entries.values()
        assert served.finish_reason == body["choices"][0]["finish_reason"]
        assert body["usage"]["completion_tokens"] < 3 or body["choices"][0]["finish_reason"] == "length"
    finally:
        bounded.close()
        thread.join(30)
