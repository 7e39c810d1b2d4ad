"""External rollouts through a real daemon: agent code in its own process, on the `openai` package, trains a job.

The job (`task.environment: external`) serves its student; the test asks the
control API for the endpoint (as `appliance jobs endpoint` does), runs
tests/agents/external_agent.py against it (builtin:calculator, group of 2),
submits a forged copy (refused with a 4xx naming the turn, nothing trained on
it) and then the real groups through `appliance jobs submit-trajectories`; the
job trains on them (trained tokens > 0) and succeeds.

The step takes two groups. Between the first submission and the second the
worker is killed (SIGKILL): the supervisor restarts it, the endpoint comes
back with the same token and address, the group accepted before the crash is
still queued, and the second group, served by the dead worker, is accepted
by the new one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from daemon_support import REPO_ROOT, wait_for
from appliance.paths import jobs_dir
from appliance.service.client import ClientError

pytestmark = pytest.mark.model

AGENT = REPO_ROOT / "tests" / "agents" / "external_agent.py"
JOB = """\
name: external-agent
student:
  model: smollm2-135m-instruct
  quantization: none
  lora: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}
task:
  environment: external
  max_turns: 2
rewards:
  - {name: environment, weight: 1.0}
grpo:
  group_size: 2
  prompts_per_step: 2
  max_new_tokens: 12
  steps: 1
checkpoint:
  every: 1
  keep_last: 1
"""


def endpoint_when_up(client, job_id: str):
    def ask():
        try:
            return client.endpoint(job_id)
        except ClientError as error:
            assert error.status == 409, error
            job = client.job(job_id)
            assert job.state in ("queued", "running", "interrupted"), f"job {job_id} is {job.state}: {job.reason}"
            return None  # starting: the model is loading

    return wait_for(ask, 600, f"job {job_id}'s endpoint")


def test_an_external_agent_trains_a_job_and_forgeries_are_refused(make_daemon, tmp_path):
    daemon = make_daemon()
    (tmp_path / "job.yaml").write_text(JOB)
    submitted = daemon.cli("submit", str(tmp_path / "job.yaml"), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job"]["id"]
    client = daemon.client(timeout=60)

    endpoint = endpoint_when_up(client, job_id)
    assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.url.endswith("/v1") and endpoint.step == 0
    shown = daemon.cli("endpoint", job_id, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["token"] == endpoint.token

    played = tmp_path / "played.json"
    agent = subprocess.run(
        [
            sys.executable,
            str(AGENT),
            "--url",
            endpoint.url,
            "--token",
            endpoint.token,
            "--model",
            endpoint.model,
            "--out",
            str(played),
            "--max-tokens",
            "12",
            "--groups",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=daemon.env,
        cwd=REPO_ROOT,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    groups = json.loads(played.read_text())["groups"]

    forged = json.loads(json.dumps(groups))
    played = forged[0]["trajectories"][0]
    turn = next(m for m in played["messages"][played["context_messages"] :] if m["role"] == "assistant")
    turn["content"] = '<tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 1}}</tool_call>'
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    refused = daemon.cli("submit-trajectories", job_id, str(tmp_path / "forged.json"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "group 0 (scenario" in refused.stderr and "trajectory 0, assistant turn 0" in refused.stderr
    assert "text differs from what the endpoint served" in refused.stderr
    with pytest.raises(ClientError) as wrong_size:
        client.submit_trajectories(job_id, [{**groups[0], "trajectories": groups[0]["trajectories"][:1]}])
    assert wrong_size.value.status == 422 and "group_size = 2" in str(wrong_size.value)
    assert client.job(job_id).step == 0  # nothing trained on the refused submissions

    # The untrained model rarely solves the task, so both rollouts usually score alike and the group would carry
    # no signal; an external agent's rewards are its own to give, and these two differ.
    for group in groups:
        for trajectory, reward in zip(group["trajectories"], (1.0, 0.0)):
            trajectory["reward"] = reward
    (tmp_path / "groups.json").write_text(json.dumps({"groups": groups[:1]}))
    accepted = daemon.cli("submit-trajectories", job_id, str(tmp_path / "groups.json"), "--json")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["accepted"] == 1

    # The step waits for its second group; the worker dies meanwhile and is restarted from scratch (no checkpoint).
    worker = json.loads((jobs_dir(daemon.data_dir) / job_id / "endpoint.json").read_text())["pid"]
    killed = time.monotonic()
    os.killpg(worker, signal.SIGKILL)
    wait_for(lambda: client.job(job_id).attempts == 2, 120, "the supervisor to restart the worker")
    restarted = endpoint_when_up(client, job_id)  # the dead worker's endpoint.json is not handed out meanwhile
    assert (restarted.url, restarted.token) == (endpoint.url, endpoint.token)
    print(f"\nworker killed -> endpoint served again (same url and token): {time.monotonic() - killed:.1f} s")
    assert json.loads((jobs_dir(daemon.data_dir) / job_id / "endpoint.json").read_text())["pid"] != worker
    (tmp_path / "groups.json").write_text(json.dumps({"groups": groups[1:]}))
    accepted = daemon.cli("submit-trajectories", job_id, str(tmp_path / "groups.json"), "--json")
    assert accepted.returncode == 0, accepted.stderr  # served before the crash, checked after it
    assert json.loads(accepted.stdout)["accepted"] == 1

    job = daemon.wait_state(job_id, ("succeeded", "failed"), timeout=600)
    assert job.state == "succeeded", job.reason
    records = client.all_metrics(job_id)
    assert len(records) == 1 and records[0]["trained_tokens"] > 0
    assert records[0]["groups_total"] == 2  # the group accepted before the crash trained too
    assert list((jobs_dir(daemon.data_dir) / job_id / "submitted").iterdir()) == []  # checkpointed: gone
    with pytest.raises(ClientError) as gone:
        client.endpoint(job_id)
    assert gone.value.status == 409  # only while it runs

    daemon.stop()  # the audit log sums the refusals it did not write in full when it closes
    audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    actions = [(line["action"], line["outcome"].split(":")[0]) for line in audit if line["job_id"] == job_id]
    summed = " ".join(line["outcome"] for line in audit if line["action"] == "summary")
    assert ("endpoint", "ok") in actions  # what the caller did is written in full
    # its refusals (the endpoint asked for while the model loaded, the forgeries) in full or summed per uid
    assert ("submit_trajectories", "refused") in actions or "submit_trajectories refused" in summed
    assert ("submit_trajectories", "ok") in actions
    assert endpoint.token not in (daemon.data_dir / "audit.jsonl").read_text()
    assert endpoint.token not in (jobs_dir(daemon.data_dir) / job_id / "log.txt").read_text()
