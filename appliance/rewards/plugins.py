"""User reward functions from a Python file: a reward named "path/to/file.py:function".

The path is relative to the job file's folder (or absolute). The file is
imported with importlib under a private module name, so two job files with a
`rewards.py` each do not collide. The function has the rule-reward signature
`fn(prompt, completion, reference, metadata, **params) -> float`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

from appliance.errors import ApplianceError


class RewardError(ApplianceError):
    """A reward in the job file cannot be built or returned a bad value; the message says what to change."""


def load_plugin(name: str, base_dir: Path) -> Callable[..., float]:
    """Import `file.py` and return its `function`; every failure is a RewardError naming both."""
    return load_from_file(name, base_dir, "reward plugin", RewardError, "relative to the job file's folder")


def load_from_file(name: str, base_dir: Path, what: str, error: type[Exception], relative_to: str) -> Callable:
    """The object `attribute` of "file.py:attribute", file relative to `base_dir`; failures raise `error`.

    The one loader of "file.py:name" plugins (rewards here, agent environments
    in appliance.agents.environment_loader); `what` and `relative_to` word its messages.
    """
    path_text, _, function_name = name.rpartition(":")
    path = Path(path_text).expanduser()
    if not path.is_absolute():
        path = Path(base_dir) / path
    path = path.resolve()
    if not path.is_file():
        raise error(f"{what} {name!r}: file {path} does not exist (paths are {relative_to})")

    # Named by the file's resolved path: the same file is one module, two files called rewards.py are two.
    module_name = "appliance_reward_plugin_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"{what} {name!r}: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)  # a half-imported module must not be found by the next attempt
        raise error(f"{what} {name!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc

    function = getattr(module, function_name, None)
    if function is None:
        available = sorted(
            attribute
            for attribute, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module_name and not attribute.startswith("_")
        )
        raise error(
            f"{what} {name!r}: {path} has no function {function_name!r}"
            f" (functions defined there: {', '.join(available) or 'none'})"
        )
    if not callable(function):
        raise error(f"{what} {name!r}: {function_name!r} in {path} is not a function")
    return function
