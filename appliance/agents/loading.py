"""Find the environment a job names: `builtin:NAME`, or `file.py:Class` from `<data-dir>/plugins/`.

Plugin files are loaded by the one "file.py:name" loader (rewards/plugins.py).
They must lie inside `<data-dir>/plugins/`, where an administrator installs
them: the daemon never runs code a caller sends (DESIGN, habit 10), so an
absolute path or one that climbs out of that folder is refused.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from appliance.agents.environment import AgentEnvironmentError, Environment
from appliance.agents.envs.calculator import CalculatorEnvironment
from appliance.agents.envs.email_search import EmailSearchEnvironment
from appliance.agents.envs.game2048 import Game2048Environment
from appliance.conventions import is_plugin_reward
from appliance.rewards.plugins import load_from_file
from appliance.suggest import closest
from appliance.paths import plugins_dir

BUILTIN: dict[str, Callable[..., Environment]] = {
    "calculator": CalculatorEnvironment,
    "email-search": EmailSearchEnvironment,
    "2048": Game2048Environment,
}


def load_environment(name: str, data_dir: Path, options: dict[str, Any] | None = None) -> Environment:
    """The environment `name` built with `options` (keyword arguments of its class)."""
    options = dict(options or {})
    if name.startswith("builtin:"):
        short = name.removeprefix("builtin:")
        factory = BUILTIN.get(short)
        if factory is None:
            close = closest(short, BUILTIN)
            hint = f"did you mean 'builtin:{close}'?" if close else "built in: " + ", ".join(
                f"builtin:{known}" for known in BUILTIN)
            raise AgentEnvironmentError(f"unknown environment {name!r}; {hint}")
    elif is_plugin_reward(name):
        factory = _plugin_class(name, plugins_dir(data_dir))
    else:
        raise AgentEnvironmentError(
            f"environment {name!r} is neither 'builtin:NAME' ({', '.join(BUILTIN)}) nor 'file.py:Class'"
            f" with file.py in {plugins_dir(data_dir)}")
    try:
        environment = factory(**options)
    except TypeError as error:
        raise AgentEnvironmentError(f"environment {name!r} does not take these options: {error}") from error
    _check_interface(name, environment)
    return environment


def _plugin_class(name: str, folder: Path) -> Callable[..., Environment]:
    file_part = name.rpartition(":")[0]
    resolved = (folder / file_part).resolve()
    if Path(file_part).expanduser().is_absolute() or not resolved.is_relative_to(folder.resolve()):
        raise AgentEnvironmentError(
            f"environment plugin {name!r}: plugins are files inside {folder}, named relative to it"
            f" (an administrator installs them there); copy the file into that folder and name it by its file name")
    return load_from_file(name, folder, "environment plugin", AgentEnvironmentError, f"relative to {folder}")


def _check_interface(name: str, environment: Any) -> None:
    missing = [attribute for attribute in ("name", "scenarios", "rollout") if not hasattr(environment, attribute)]
    if missing:
        raise AgentEnvironmentError(
            f"environment {name!r} lacks {', '.join(missing)}; an environment has a name, "
            "scenarios(split, count, seed) and async rollout(client, scenario)")
    if not inspect.iscoroutinefunction(environment.rollout):
        raise AgentEnvironmentError(f"environment {name!r}: rollout must be 'async def rollout(client, scenario)'")
