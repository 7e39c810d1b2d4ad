"""Find the environment a job names: `builtin:NAME`, or `file.py:Class` from `<data-dir>/plugins/`.

Plugin files are loaded by the one "file.py:name" loader (rewards/plugins.py).
They must lie inside `<data-dir>/plugins/`, where an administrator installs
them: the daemon never runs code a caller sends (DESIGN, habit 10), so an
absolute path or one that climbs out of that folder is refused.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Callable

from appliance.agents.environment import AgentEnvironmentError, Environment
from appliance.agents.envs.calculator import CalculatorEnvironment
from appliance.agents.envs.email_search import EmailSearchEnvironment
from appliance.agents.envs.game2048 import Game2048Environment
from appliance.conventions import EXTERNAL_ENVIRONMENT, is_plugin_reward
from appliance.rewards.plugins import load_from_file
from appliance.suggest import closest
from appliance.paths import plugins_dir

BUILTIN: dict[str, Callable[..., Environment]] = {
    "calculator": CalculatorEnvironment,
    "email_search": EmailSearchEnvironment,
    "game2048": Game2048Environment,
}


def load_environment(name: str, data_dir: Path, options: dict[str, Any] | None = None) -> Environment:
    """The environment `name` built with `options` (keyword arguments of its class)."""
    options = dict(options or {})
    problem = _name_problem(name, data_dir)
    if problem is not None:
        raise AgentEnvironmentError(problem)
    if name.startswith("builtin:"):
        factory = BUILTIN[name.removeprefix("builtin:")]
    else:
        factory = _plugin_class(name, plugins_dir(data_dir))
    try:
        environment = factory(**options)
    except TypeError as error:  # an unknown or missing keyword: the options do not fit the class
        raise AgentEnvironmentError(f"environment {name!r} does not take these options: {error}") from error
    _check_interface(name, environment)
    return environment


def _plugin_class(name: str, folder: Path) -> Callable[..., Environment]:
    file_part = name.rpartition(":")[0]
    # Resolved before the check, so a symlink or "../" that leads out of the plugins folder is refused too.
    resolved = (folder / file_part).resolve()
    if Path(file_part).expanduser().is_absolute() or not resolved.is_relative_to(folder.resolve()):
        raise AgentEnvironmentError(
            f"environment plugin {name!r}: plugins are files inside {folder}, named relative to it"
            f" (an administrator installs them there); copy the file into that folder and name it by its file name"
        )
    return load_from_file(name, folder, "environment plugin", AgentEnvironmentError, f"relative to {folder}")


def _check_interface(name: str, environment: Any) -> None:
    missing = [attribute for attribute in ("name", "scenarios", "rollout") if not hasattr(environment, attribute)]
    if missing:
        raise AgentEnvironmentError(
            f"environment {name!r} lacks {', '.join(missing)}; an environment has a name, "
            "scenarios(split, count, seed) and async rollout(client, scenario)"
        )
    if not inspect.iscoroutinefunction(environment.rollout):
        raise AgentEnvironmentError(f"environment {name!r}: rollout must be 'async def rollout(client, scenario)'")


def _name_problem(name: str, data_dir: Path) -> str | None:
    """Why `name` is not a built-in name nor a plugin file.py:Class spelling; the file itself is not read."""
    if name.startswith("builtin:"):
        short = name.removeprefix("builtin:")
        if short in BUILTIN:
            return None
        close = closest(short, BUILTIN)
        hint = (
            f"did you mean 'builtin:{close}'?"
            if close
            else "built in: " + ", ".join(f"builtin:{known}" for known in BUILTIN)
        )
        return f"unknown environment {name!r}; {hint}"
    if is_plugin_reward(name):
        return None
    close = closest(name, [f"builtin:{known}" for known in BUILTIN] + list(extra_names()))
    hint = f"; did you mean {close!r}?" if close else ""
    return (
        f"environment {name!r} is neither 'builtin:NAME' ({', '.join(BUILTIN)}) nor 'file.py:Class'"
        f" with file.py in {plugins_dir(data_dir)}{hint}"
    )


def extra_names() -> tuple[str, ...]:
    """task.environment values that name no environment class (sources built elsewhere)."""
    return (EXTERNAL_ENVIRONMENT,)


def environment_problem(name: str, data_dir: Path) -> str | None:
    """Why the job key `task.environment: name` cannot be run here, checked without running plugin code.

    The loader's rules: a known built-in, or a file inside <data-dir>/plugins/ whose
    top level defines the class (the file is parsed, never imported: checking a job runs no user code).
    """
    if name in extra_names():
        return None
    problem = _name_problem(name, data_dir)
    if problem is not None or name.startswith("builtin:"):
        return problem
    folder = plugins_dir(data_dir)
    file_part, _, class_name = name.rpartition(":")
    resolved = (folder / file_part).resolve()
    if Path(file_part).expanduser().is_absolute() or not resolved.is_relative_to(folder.resolve()):
        return (
            f"environment plugin {name!r}: plugins are files inside {folder}, named relative to it"
            " (an administrator installs them there)"
        )
    if not resolved.is_file():
        return f"environment plugin {name!r}: {resolved} does not exist; an administrator installs plugins in {folder}"
    try:
        tree = ast.parse(resolved.read_bytes(), filename=str(resolved))
    except (SyntaxError, ValueError, OSError) as error:
        return f"environment plugin {name!r}: {resolved} cannot be parsed: {error}"
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    if class_name in classes:
        return None
    close = closest(class_name, classes)
    hint = f"; did you mean '{close}'?" if close else (f"; it defines: {', '.join(classes)}" if classes else "")
    return f"environment plugin {name!r}: {resolved.name} defines no class '{class_name}'{hint}"
