"""The job key task.environment: checked with the loader's rules, exclusive with a dataset, built into a source."""

from __future__ import annotations

import pytest

from appliance.agents.environment import AgentEnvironmentError
from appliance.agents.trajectory_sources import EnvironmentSource, make_source
from appliance.job_checks import check_job_file
from appliance.config.job_file import parse_job_text

JOB = """\
name: agent-job
student:
  model: smollm2-135m-instruct
task:
  environment: {environment}
{extra}rewards:
  - {{name: environment}}
"""


def _check(tmp_path, environment, extra=""):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(environment=environment, extra=extra))
    return check_job_file(path, tmp_path, check_models=False)


@pytest.mark.parametrize("environment", ["builtin:calculator", "builtin:email_search", "builtin:game2048", "external"])
def test_builtin_and_external_environments_pass_the_check(tmp_path, environment):
    spec, errors = _check(tmp_path, environment)
    assert errors == [] and spec.task.environment == environment


def test_a_mistyped_builtin_gets_a_did_you_mean_at_its_line(tmp_path):
    _, errors = _check(tmp_path, "builtin:calculater")
    assert [(e.key, e.line) for e in errors] == [("task.environment", 5)]
    assert "did you mean 'builtin:calculator'?" in errors[0].message


def test_a_plugin_is_checked_in_the_plugins_folder_without_running_it(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "mine.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('x')\nclass Mine:\n    name = 'mine'\n"
    )
    assert _check(tmp_path, "mine.py:Mine")[1] == []
    _, errors = _check(tmp_path, "mine.py:Mien")
    assert "defines no class 'Mien'; did you mean 'Mine'?" in errors[0].message
    _, errors = _check(tmp_path, "other.py:Mine")
    assert "does not exist" in errors[0].message and str(tmp_path / "plugins") in errors[0].message
    assert not (tmp_path / "plugins" / "ran").exists()


def test_dataset_and_environment_exclude_each_other_in_one_error(tmp_path):
    _, errors = _check(tmp_path, "builtin:calculator", "  dataset: builtin:gsm8k\n")
    assert len(errors) == 1
    assert "task.environment (builtin:calculator) and task.dataset exclude each other" in errors[0].message


@pytest.mark.parametrize("task", ["{environment: builtin:calculator, max_turns: 2}", "{dataset: builtin:multiply}"])
def test_a_spec_written_out_with_every_default_reads_back(task):
    """job.yaml in a job folder holds every key (export and resume read it back): defaults are no conflict."""
    import yaml

    from appliance.config.schema import JobSpec

    spec = parse_job_text(
        f"name: x\nstudent: {{model: m}}\ntask: {task}\nrewards: [{{name: correctness}}]\n", "job.yaml"
    )
    dumped = yaml.safe_load(yaml.safe_dump(spec.model_dump(mode="json")))
    assert JobSpec.model_validate(dumped) == spec


def test_agent_only_keys_without_an_environment_are_refused():
    with pytest.raises(Exception, match="max_turns applies to agent jobs only"):
        parse_job_text(
            "name: x\nstudent: {model: m}\ntask: {max_turns: 3}\nrewards: [{name: correctness}]\n", "job.yaml"
        )


@pytest.mark.parametrize(
    "task, says",
    [
        ("{max_staleness: 3}", "max_staleness applies to agent jobs only"),
        ("{mask_truncated: turn}", "mask_truncated applies to agent jobs only"),
        ("{environment: external, mask_truncated: some}", "mask_truncated"),
        ("{environment: external, max_staleness: -1}", "max_staleness"),
    ],
)
def test_the_truncation_and_staleness_keys_are_checked(task, says):
    with pytest.raises(Exception, match=says):
        parse_job_text(f"name: x\nstudent: {{model: m}}\ntask: {task}\nrewards: [{{name: correctness}}]\n", "job.yaml")
    text = "name: x\nstudent: {model: m}\ntask: {environment: external, max_staleness: 0, mask_truncated: trajectory}\n"
    spec = parse_job_text(text + "rewards: [{name: environment}]\n", "job.yaml")
    assert (spec.task.max_staleness, spec.task.mask_truncated) == (0, "trajectory")


def test_make_source_builds_the_environment_and_says_what_external_needs(tmp_path):
    spec = parse_job_text(JOB.format(environment="builtin:game2048", extra="  max_turns: 2\n"), "job.yaml")
    source = make_source(spec, engine=None, data_dir=tmp_path)
    assert isinstance(source, EnvironmentSource) and source.environment.max_turns == 2
    external = spec.model_copy(update={"task": spec.task.model_copy(update={"environment": "external"})})
    with pytest.raises(AgentEnvironmentError, match="'external' needs the job folder"):
        make_source(external, engine=None, data_dir=tmp_path)
    assert not (tmp_path / "endpoint.json").exists()


def test_an_agent_job_plans_with_its_stated_trajectory_bound(tmp_path, demo_model_dir):
    from appliance.budget.device_probe import DeviceInfo
    from appliance.budget.plan import plan_job
    from appliance.budget.shapes import load_config
    from appliance.agents.envs.calculator import CalculatorEnvironment
    from appliance.budget.workload import AGENT_TURNS_ASSUMED
    from appliance.grpo.prompt_lengths import measure_prompt_tokens

    spec = parse_job_text(
        JOB.format(environment="builtin:calculator", extra="  max_turns: 3\n")
        + "grpo: {max_new_tokens: 40, group_size: 4, prompts_per_step: 2}\n",
        "job.yaml",
    )
    opening = measure_prompt_tokens(spec, demo_model_dir, tmp_path)
    assert 100 < opening < 400  # the calculator's system prompt with its tool, the question, the template
    device = DeviceInfo("cuda", 24 * 2**30, 0, "fake")
    plan = plan_job(spec, load_config(demo_model_dir / "config.json"), None, device, prompt_tokens=opening)
    assert plan.fits
    assert plan.sequence_tokens["student"] == opening + 3 * (40 + CalculatorEnvironment.result_tokens)
    assert "3 turns (task.max_turns)" in plan.choices.worded_reasons()["sequence_tokens"]
    assert "sequence_tokens" in plan.render()
    unset = parse_job_text(
        JOB.format(environment="builtin:calculator", extra="") + "grpo: {max_new_tokens: 40}\n", "job.yaml"
    )
    plan = plan_job(unset, load_config(demo_model_dir / "config.json"), None, device, prompt_tokens=opening)
    assert plan.sequence_tokens["student"] == opening + AGENT_TURNS_ASSUMED * (40 + CalculatorEnvironment.result_tokens)
    assert "assumed; set task.max_turns" in plan.choices.worded_reasons()["sequence_tokens"]


def test_the_planned_opening_is_all_a_trajectory_holds_before_its_first_trained_token(demo_model_dir):
    # The calculator shows two worked episodes between its system prompt and the question: the plan's
    # opening must count them (it once measured 196 of the 350 tokens).
    from appliance.agents.envs.calculator import CalculatorEnvironment
    from appliance.agents.tokenize import tokenize_trajectory
    from appliance.agents.trajectory import AssistantMessage, SystemMessage, Trajectory, UserMessage
    from appliance.grpo.prompt_lengths import longest_opening_tokens
    from appliance.models.causal_lm import load_tokenizer

    environment, tokenizer = CalculatorEnvironment(), load_tokenizer(demo_model_dir)
    scenario = environment.scenarios("train", 1, seed=0)[0]
    _, system, user = environment.start(scenario)
    examples = environment.examples(scenario)
    assert examples
    trajectory = Trajectory(
        scenario_id=scenario.id,
        messages=[SystemMessage(content=system), *examples, UserMessage(content=user), AssistantMessage(content="7")],
        tools=environment.tools(),
        context_messages=1 + len(examples),
    )
    first_trained = tokenize_trajectory(tokenizer, trajectory).assistant_mask.index(1)
    assert longest_opening_tokens(environment, tokenizer, scenarios=1) == first_trained


def test_the_calculator_plans_room_for_the_longest_tool_message_its_loop_writes(demo_model_dir):
    # Three turns of the worst replies the plan has to hold: an unreadable call (its error repeats an example
    # call), a reply with no JSON object, a call of an unknown tool with a long name. Each is answered by the
    # real tool loop; what follows each reply, up to the next one, must fit the calculator's result_tokens.
    import asyncio

    from appliance.agents.environment import AssistantTurn
    from appliance.agents.envs.calculator import CalculatorEnvironment
    from appliance.agents.tokenize import tokenize_trajectory
    from appliance.agents.toolcalls import parse_tool_calls
    from appliance.models.causal_lm import load_tokenizer

    replies = iter(
        [
            '<tool_call>{"name": "multiply", "arguments": {"a": 12345678901234567890 "b": 98765432109876}}</tool_call>',
            "<tool_call>I will now multiply the two numbers</tool_call>",
            '<tool_call>{"name": "multiply_two_large_integers_exactly", "arguments": {"a": 99, "b": 99}}</tool_call>',
        ]
    )

    class Replies:
        async def chat(self, messages, tools):
            text = next(replies)
            parsed = parse_tool_calls(text, call_id_prefix="call")
            return AssistantTurn(text=text, tool_calls=parsed.calls, tool_call_errors=parsed.errors)

    environment = CalculatorEnvironment()
    trajectory = asyncio.run(environment.rollout(Replies(), environment.scenarios("train", 1, seed=0)[0]))
    assert trajectory.metrics["turns"] == 3 and trajectory.metrics["malformed_calls"] == 2
    mask = tokenize_trajectory(load_tokenizer(demo_model_dir), trajectory).assistant_mask
    starts = [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
    ends = [i for i in range(1, len(mask)) if not mask[i] and mask[i - 1]]
    gaps = [start - end for end, start in zip(ends, starts[1:])] + [len(mask) - ends[-1]]
    assert len(gaps) == 3 and min(gaps) > 20  # each reply was answered by an error message
    assert max(gaps) <= CalculatorEnvironment.result_tokens
