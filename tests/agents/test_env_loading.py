"""Loading environments: builtin:NAME, and file.py:Class from <data-dir>/plugins/ only."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from appliance.agents.environment import AgentEnvironmentError, AssistantTurn, rollout_groups
from appliance.agents.envs.calculator import CalculatorEnvironment
from appliance.agents.environment_loader import load_environment
from appliance.errors import ApplianceError

PLUGIN = textwrap.dedent('''
    from appliance.agents.environment import Scenario
    from appliance.agents.trajectory import Trajectory, UserMessage


    class Echo:
        """Asks the model to say a word; reward 1 when it does."""

        name = "echo"

        def __init__(self, word="banana"):
            self.word = word

        def scenarios(self, split, count, seed):
            return [Scenario(id=f"echo-{n}", data={"word": self.word}) for n in range(count)]

        async def rollout(self, client, scenario):
            messages = [UserMessage(content="Say " + scenario.data["word"])]
            turn = await client.chat(messages, [])
            messages.append(turn.message())
            return Trajectory(scenario_id=scenario.id, messages=messages,
                              reward=float(scenario.data["word"] in turn.text))


    class NotAnEnvironment:
        name = "nope"


    def helper():
        return 1
''')


class Parrot:
    async def chat(self, messages, tools):
        return AssistantTurn(text=messages[-1].content.removeprefix("Say "))


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "echo_env.py").write_text(PLUGIN)
    return tmp_path


def test_builtin_environments_load_with_options(data_dir):
    environment = load_environment("builtin:calculator", data_dir, {"operand_min": 2, "operand_max": 9, "held_out": 10})
    assert isinstance(environment, CalculatorEnvironment)
    assert len(environment.scenarios("train", 1000, seed=0)) == 64 - 10
    assert load_environment("builtin:game2048", data_dir).name == "game2048"
    assert load_environment("builtin:email_search", data_dir).name == "email_search"


def test_a_plugin_from_the_data_dir_runs(data_dir):
    environment = load_environment("echo_env.py:Echo", data_dir, {"word": "kiwi"})
    groups = asyncio.run(rollout_groups(environment, Parrot(), environment.scenarios("train", 2, seed=0), 2))
    assert [t.reward for g in groups for t in g.trajectories] == [1.0] * 4
    assert groups[0].trajectories[0].messages[-1].content == "kiwi"


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("builtin:calculater", {}, "unknown environment 'builtin:calculater'; did you mean 'builtin:calculator'?"),
        ("builtin:chess", {}, "built in: builtin:calculator, builtin:email_search, builtin:game2048"),
        ("calculator", {}, "is neither 'builtin:NAME'"),
        ("builtin:calculator", {"operands": 3}, "does not take these options"),
        ("missing.py:Env", {}, "environment plugin 'missing.py:Env': file "),
        ("echo_env.py:Parrot", {}, "has no function 'Parrot' (functions defined there: helper)"),
        ("echo_env.py:NotAnEnvironment", {}, "lacks scenarios, rollout"),
        ("../echo_env.py:Echo", {}, "plugins are files inside"),
        ("/etc/echo_env.py:Echo", {}, "plugins are files inside"),
    ],
)
def test_bad_environment_names_get_one_clear_error(data_dir, name, options, message):
    with pytest.raises(AgentEnvironmentError) as caught:
        load_environment(name, data_dir, options)
    assert message in str(caught.value)
    assert isinstance(caught.value, ApplianceError)


def test_a_plugin_outside_the_plugins_folder_is_not_imported(data_dir):
    marker = data_dir / "ran.marker"
    (data_dir / "outside.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Env: pass\n")
    with pytest.raises(AgentEnvironmentError, match="plugins are files inside"):
        load_environment("../outside.py:Env", data_dir)
    assert not marker.exists()
