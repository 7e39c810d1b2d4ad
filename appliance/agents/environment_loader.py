"""Find the environment a job names: `builtin:NAME`, or `file.py:Class` from `<data-dir>/plugins/`.

Plugin files are loaded by the one "file.py:name" loader (rewards/plugins.py).
They must lie inside `<data-dir>/plugins/`, where an administrator installs
them: the daemon never runs code a caller sends (DESIGN, habit 10), so an
absolute path or one that climbs out of that folder is refused.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path
from typing import Any, Callable

from appliance.agents.environment import AgentEnvironmentError, Environment
from appliance.agents.envs.calculator import CalculatorEnvironment
from appliance.agents.envs.email_search import EmailSearchEnvironment
from appliance.agents.envs.game2048 import Game2048Environment
from appliance.bounded_file import MAX_SOURCE_BYTES, FileTooLarge, read_capped
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
        tree = ast.parse(read_capped(resolved, MAX_SOURCE_BYTES), filename=str(resolved))
    except (SyntaxError, ValueError, OSError, FileTooLarge) as error:
        return f"environment plugin {name!r}: {resolved} cannot be parsed: {error}"
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    if class_name in classes:
        return None
    close = closest(class_name, classes)
    hint = f"; did you mean '{close}'?" if close else (f"; it defines: {', '.join(classes)}" if classes else "")
    return f"environment plugin {name!r}: {resolved.name} defines no class '{class_name}'{hint}"


def option_problems(name: str, options: dict[str, Any], data_dir: Path) -> list[tuple[str, str]]:
    """(option, problem) for each task.environment_options entry the environment does not take, or takes with
    another type or outside its bounds; found without running plugin code (a plugin's __init__ is parsed)."""
    if not options:
        return []
    if name in extra_names():
        return [(key, f"environment {name!r} takes no options; drop task.environment_options") for key in options]
    if name.startswith("builtin:") and name.removeprefix("builtin:") in BUILTIN:
        factory = BUILTIN[name.removeprefix("builtin:")]
        parameters = [
            p
            for p in inspect.signature(factory).parameters.values()
            if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        hints = typing.get_type_hints(factory.__init__)
        bounds = getattr(factory, "option_bounds", {})
        return [
            (key, problem)
            for key, value in options.items()
            if (problem := _option_problem(key, value, [p.name for p in parameters], hints.get(key), bounds.get(key)))
        ]
    accepted = _plugin_parameters(name, data_dir)
    if accepted is None:  # the name's own problem is reported at task.environment, or it takes **kwargs
        return []
    return [(key, problem) for key in options if (problem := _option_problem(key, None, accepted, None, None))]


_KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _option_problem(key: str, value: Any, accepted: list[str], kind: Any, bounds: tuple | None) -> str | None:
    if key not in accepted:
        close = closest(key, accepted)
        hint = f"did you mean {close!r}?" if close else f"it takes: {', '.join(accepted) or 'no options'}"
        return f"the environment has no option {key!r}; {hint}"
    if kind in _KIND_WORDS and not (type(value) is kind or (kind is float and type(value) is int)):
        return f"option {key!r} must be {_KIND_WORDS[kind]}"
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        return f"option {key!r} must be within {bounds[0]}..{bounds[1]}, not {value}"
    return None


def _plugin_parameters(name: str, data_dir: Path) -> list[str] | None:
    """The keyword parameters of a plugin environment class's __init__ (parsed, not run); None when unknown."""
    folder = plugins_dir(data_dir)
    file_part, _, class_name = name.rpartition(":")
    try:
        source = read_capped((folder / file_part).resolve(), MAX_SOURCE_BYTES)
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, FileTooLarge):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    if item.args.kwarg is not None:
                        return None
                    arguments = item.args.posonlyargs[1:] + item.args.args[1:] + item.args.kwonlyargs
                    return [argument.arg for argument in arguments]
            return []
    return None
