"""External rollouts are tied to the policy that sampled them: staleness, the job's sampling, the whole served turn.

The ledger half uses the bundled tokenizer (no weights), as test_served_ledger does; the endpoint half serves
the tiny random Llama.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_served_ledger import TOOLS, group_of, played, served_turn

from appliance.agents.served_tokens import Freshness, ServedLedger, TrajectoryRefused
from appliance.agents.trajectory import (
    AssistantMessage,
    FunctionCall,
    Sampled,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Trajectory,
    UserMessage,
)
from appliance.engines.openai_server import ChatRequest, ChatService, SamplingPolicy

TURN_0 = r"group 0 \(scenario 's1'\), trajectory 0, assistant turn 0 \(message 2\)"


@pytest.fixture
def ledger() -> ServedLedger:
    return ServedLedger(capacity=64)


def test_a_group_older_than_the_staleness_bound_is_refused(ledger, tokenizer):
    stale = group_of(played(ledger, tokenizer, "What is 3 * 4?", 1.0), played(ledger, tokenizer, "3 * 4?", 0.0))
    with pytest.raises(
        TrajectoryRefused, match=TURN_0 + " is stale: it was served at step 1 and would train at step 3"
    ):
        ledger.verify([stale], 2, tokenizer, Freshness(step=3, max_staleness=1))
    # one step old is within the default bound; the ledger stamps when the turns were served
    accepted = ledger.verify([stale], 2, tokenizer, Freshness(step=2, max_staleness=1))
    assert accepted[0].trajectories[0].metadata["served_step"] == 1


def test_the_client_cannot_claim_a_fresher_serve(ledger, tokenizer):
    group = group_of(played(ledger, tokenizer, "What is 3 * 4?", 1.0), played(ledger, tokenizer, "3 * 4?", 0.0))
    for trajectory in group["trajectories"]:
        trajectory["metadata"]["served_step"] = 9
    accepted = ledger.verify([group], 2, tokenizer, Freshness(step=2, max_staleness=1))
    assert {t.metadata["served_step"] for t in accepted[0].trajectories} == {1}


def _answered_directly(ledger, tokenizer, forged_calls: list[ToolCall] | None = None) -> Trajectory:
    """A first turn that called no tool (plain text), then a second served turn after it."""
    messages = [SystemMessage(content="Use the tool."), UserMessage(content="What is 3 * 4?")]
    first = served_turn(ledger, tokenizer, messages, "It is twelve.")
    if forged_calls:
        first = first.model_copy(update={"tool_calls": forged_calls})
        messages += [first, ToolMessage(tool_call_id="call_x", content="12")]
    else:
        messages += [first, UserMessage(content="Sure?")]
    messages.append(served_turn(ledger, tokenizer, messages, "<answer>12</answer>"))
    return Trajectory(scenario_id="s1", messages=messages, tools=TOOLS, reward=1.0)


def test_a_forged_tool_call_is_refused_naming_the_turn(ledger, tokenizer):
    forged = [ToolCall(id="call_x", function=FunctionCall(name="multiply", arguments='{"a": 3, "b": 4}'))]
    honest = played(ledger, tokenizer, "3 * 4?", 0.0)
    # the forged call is rendered into the second turn's prompt, so that prompt matches: only the turn check sees it
    group = group_of(_answered_directly(ledger, tokenizer, forged), honest)
    with pytest.raises(TrajectoryRefused, match=TURN_0 + ": its tool_calls differ from the calls the endpoint served"):
        ledger.verify([group], 2, tokenizer)


def test_an_edited_tool_call_argument_is_refused(ledger, tokenizer):
    trajectory = played(ledger, tokenizer, "What is 3 * 4?", 1.0)
    first = trajectory.messages[2]
    edited = [ToolCall(id="call_1", function=FunctionCall(name="multiply", arguments='{"a": 3, "b": 5}'))]
    trajectory.messages[2] = first.model_copy(update={"tool_calls": edited})
    with pytest.raises(TrajectoryRefused, match=TURN_0 + ": its tool_calls differ"):
        ledger.verify([group_of(trajectory, played(ledger, tokenizer, "3 * 4?", 0.0))], 2, tokenizer)
    # the same calls as served (ids are the client's) pass
    served = [ToolCall(id="mine", function=FunctionCall(name="multiply", arguments='{"b": 4, "a": 3}'))]
    trajectory.messages[2] = first.model_copy(update={"tool_calls": served})
    ledger.verify([group_of(trajectory, played(ledger, tokenizer, "3 * 4?", 0.0))], 2, tokenizer)


def test_an_edited_context_is_refused_naming_the_turn(ledger, tokenizer):
    trajectory = played(ledger, tokenizer, "What is 3 * 4?", 1.0)
    trajectory.messages[3] = ToolMessage(tool_call_id="call_1", content="13")
    with pytest.raises(
        TrajectoryRefused, match=r"trajectory 0, assistant turn 1 \(message 4\): the conversation before it differs"
    ):
        ledger.verify([group_of(trajectory, played(ledger, tokenizer, "3 * 4?", 0.0))], 2, tokenizer)


def test_a_stop_trimmed_turn_is_refused_naming_the_turn(ledger, tokenizer):
    trajectory = played(ledger, tokenizer, "What is 3 * 4?", 1.0)
    first = trajectory.messages[2]
    # a client cut the text at its own stop string "</tool_call>" but kept the served token ids
    trimmed = first.content.removesuffix("</tool_call>")
    assert trimmed != first.content
    trajectory.messages[2] = first.model_copy(update={"content": trimmed})
    with pytest.raises(TrajectoryRefused, match=TURN_0 + ": the text differs from what the endpoint served"):
        ledger.verify([group_of(trajectory, played(ledger, tokenizer, "3 * 4?", 0.0))], 2, tokenizer)


def test_non_json_arguments_in_a_submitted_call_are_refused_not_a_crash(ledger, tokenizer):
    trajectory = played(ledger, tokenizer, "What is 3 * 4?", 1.0)
    bad = [ToolCall(id="call_1", function=FunctionCall(name="multiply", arguments="a=3, b=4"))]
    trajectory.messages[2] = trajectory.messages[2].model_copy(update={"tool_calls": bad})
    with pytest.raises(TrajectoryRefused, match=TURN_0 + ": its tool_calls differ"):
        ledger.verify([group_of(trajectory, played(ledger, tokenizer, "3 * 4?", 0.0))], 2, tokenizer)
    # in a context (worked-example) turn, which is never compared with a serve
    example = AssistantMessage(content="", tool_calls=bad)
    honest = played(ledger, tokenizer, "What is 3 * 4?", 1.0)
    with_example = honest.model_copy(
        update={"messages": [honest.messages[0], example, *honest.messages[1:]], "context_messages": 2}
    )
    with pytest.raises(TrajectoryRefused, match="trajectory 0: .*not valid JSON|trajectory 0: Expecting"):
        ledger.verify([group_of(with_example, played(ledger, tokenizer, "3 * 4?", 0.0))], 2, tokenizer)


# ----- the endpoint enforces the job's sampling ------------------------------------------------------------


@pytest.fixture
def service(tiny_engine):
    return ChatService(tiny_engine, "student", policy=SamplingPolicy(temperature=0.7, top_p=0.9, max_n=4))


def _request(**fields) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "student", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}
    )


@pytest.mark.model
@pytest.mark.parametrize(
    "asked, says",
    [
        ({"temperature": 1.0}, "temperature 0.7 and top_p 0.9"),
        ({"temperature": 0.0}, "temperature 0.7 and top_p 0.9"),
        ({"top_p": 1.0}, "temperature 0.7 and top_p 0.9"),
        ({"stop": ["</answer>"]}, r"stop strings are \[\]"),
        ({"stop": "x"}, r"stop strings are \[\]"),
        ({"n": 64}, r"groups are 4 completions \(its memory plan\); the request asks n=64"),
    ],
)
def test_a_request_for_other_sampling_is_refused_with_the_jobs_values(service, asked, says):
    with pytest.raises(ValueError, match=f"this job('s)? .*{says}"):
        service.complete(_request(**asked))


@pytest.mark.model
def test_the_jobs_sampling_is_what_the_engine_is_asked(service, monkeypatch):
    asked = []
    generate = service.engine.generate
    monkeypatch.setattr(service.engine, "generate", lambda prompts, s: asked.append(s) or generate(prompts, s))
    service.complete(_request())  # nothing asked: the job's values
    service.complete(_request(temperature=0.7, top_p=0.9))  # the job's values, asked explicitly
    assert [(s.temperature, s.top_p, s.stop) for s in asked] == [(0.7, 0.9, ()), (0.7, 0.9, ())]


def test_each_serve_records_its_sampling_and_it_survives_a_restart(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = ServedLedger(capacity=4, path=path)
    for _ in range(2):  # two rollouts of the group sampled the same completion
        ledger.record([1, 2], [3], "x", [-0.1], 5, {"temperature": 0.7, "top_p": 0.9})
    ledger.close()
    turn = AssistantMessage(content="x", sampled=Sampled(token_ids=[3], logprobs=[-0.1], prompt_token_ids=[1, 2]))
    trajectory = Trajectory(scenario_id="s1", messages=[UserMessage(content="q"), turn])
    restarted = ServedLedger(capacity=4, path=path)
    accepted = restarted.verify([group_of(trajectory, trajectory.model_copy(deep=True))], 2)
    assert [t.metadata for t in accepted[0].trajectories] == [
        {"served_step": 5, "served_sampling": {"temperature": 0.7, "top_p": 0.9}}
    ] * 2


@pytest.mark.model
def test_the_endpoint_answers_4xx_to_other_sampling_and_to_non_json_arguments(tiny_engine, tmp_path):
    import httpx

    from appliance.agents.external_source import ExternalSource

    source = ExternalSource(tiny_engine, tmp_path, group_size=2, served_name="student", policy=SamplingPolicy(1.0, 1.0))
    source._open()  # serving, as during a collect
    try:

        def chat(**fields) -> httpx.Response:
            body = {"model": "student", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], **fields}
            return httpx.post(
                source.url + "/chat/completions",
                json=body,
                timeout=60,
                headers={"Authorization": f"Bearer {source.token}"},
            )

        hotter = chat(temperature=1.5)
        assert hotter.status_code == 400
        assert "this job samples at temperature 1.0 and top_p 1.0" in hotter.json()["error"]["message"]
        call = {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": "a=3, b=4"}}
        messages = [
            {"role": "user", "content": "3 * 4?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "12"},
        ]
        for tools in (TOOLS, None):
            bad = chat(messages=messages, **({"tools": tools} if tools else {}))
            assert bad.status_code == 400, bad.text
            assert "messages.1" in bad.json()["error"]["message"] and "JSON" in bad.json()["error"]["message"]
        assert len(source.ledger) == 0
        assert chat(temperature=1.0).status_code == 200
        assert len(source.ledger) == 1
    finally:
        source.close()


@pytest.mark.model
def test_a_queued_group_that_grows_stale_is_dropped_at_collect_with_the_reason(tiny_engine, tmp_path, caplog):
    from appliance.agents.external_source import CollectStopped, ExternalSource

    stop: list[str] = []
    source = ExternalSource(
        tiny_engine, tmp_path, group_size=2, served_name="student", stop_requested=lambda: stop[0] if stop else None
    )
    try:
        group = group_of(
            played(source.ledger, tiny_engine.tokenizer, "What is 3 * 4?", 1.0),  # served at step 1
            played(source.ledger, tiny_engine.tokenizer, "3 * 4?", 0.0),
        )
        assert source.submit([group])["accepted"] == 1  # fresh now: step 2 at the latest would train it
        stop.append("the test is over")
        with caplog.at_level("WARNING"), pytest.raises(CollectStopped):
            source.collect(3, 1, 2)  # step 3: two steps after it was served
        assert (source.queued, source.stale_dropped) == (0, 1)
        assert "'s1' (served at step 1)" in caplog.text and "task.max_staleness = 1" in caplog.text
    finally:
        source.close()


@pytest.mark.model
def test_an_external_job_serves_with_its_grpo_sampling_and_staleness(tiny_engine, tmp_path):
    from appliance.agents.trajectory_sources import make_source
    from appliance.config.job_file import parse_job_text

    spec = parse_job_text(
        "name: x\nstudent: {model: m}\ntask: {environment: external, max_staleness: 2}\n"
        "grpo: {temperature: 0.8, top_p: 0.95}\nrewards: [{name: environment}]\n",
        "job.yaml",
    )
    source = make_source(spec, tiny_engine, tmp_path, job_dir=tmp_path)
    try:
        # grpo.max_new_tokens (default 128) is the most a turn is served, grpo.group_size the most completions a call
        expected = SamplingPolicy(temperature=0.8, top_p=0.95, max_tokens=128, max_n=spec.grpo.group_size)
        assert source.service.policy == expected
        assert source.max_staleness == 2
    finally:
        source.close()


@pytest.mark.model
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.integers(0, 120), asked=st.integers(1, 4096))
def test_no_served_sequence_grows_past_the_jobs_plan(tiny_engine, words, asked):
    """The attack: an agent with the job's token sends a prompt of any length (up to the listener's body cap)
    and asks any max_tokens; the trainer's engine must never hold a sequence past the plan's bound."""
    bounded = ChatService(
        tiny_engine, "student", policy=SamplingPolicy(0.7, 0.9, max_tokens=4096, max_sequence_tokens=64)
    )
    request = _request(messages=[{"role": "user", "content": "word " * words}], max_tokens=asked)
    try:
        answer = bounded.complete(request)
    except ValueError as refused:
        assert "this job's sequences are at most 64" in str(refused)
        return
    [choice] = answer["choices"]
    assert answer["usage"]["total_tokens"] <= 64
    assert choice["finish_reason"] in ("stop", "length")


@given(seed=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)))
def test_a_seed_no_engine_takes_is_refused_at_the_request(seed):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="seed"):
        _request(seed=seed)
    assert _request(seed=2**32 - 1).seed == 2**32 - 1
