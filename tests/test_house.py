"""The house a newcomer walks (issue 38): the step in a few files, one name per concept, short functions.

These read the source as text and syntax trees; the call-chain test runs `appliance train` on the tiny model
and prints the frames from `cli/main.main` to the GRPO loss.
"""

from __future__ import annotations

import ast
import sys
import traceback
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("appliance", "tui")
MAX_GRPO_MODULES = 16
MAX_FUNCTION_LINES = 60
MAX_BUILD_TRAINER_LINES = 40
MAX_FRAMES_TO_THE_LOSS = 8


def _modules(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (REPO / package).rglob("*.py"))


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_grpo_holds_at_most_sixteen_modules():
    modules = [path.name for path in (REPO / "appliance" / "grpo").glob("*.py")]
    assert len(modules) <= MAX_GRPO_MODULES, sorted(modules)


def test_no_two_modules_share_a_basename():
    """A path says what it holds: `budget/phase_memory.py` and `grpo/trainer.py`, never two `phases.py`."""
    homes = defaultdict(list)
    for path in _modules(*PACKAGES):
        if path.name != "__init__.py":
            homes[path.name].append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1}
    assert not shared, shared


def _named(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def _aliased_imports(path: Path) -> list[str]:
    """`import appliance.x as y` and `from appliance.x import y as z` (z != y): names that hide what they are."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            aliased = [a for a in node.names if a.asname and a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            aliased = [a for a in node.names if a.asname and a.asname != a.name]
        else:
            continue
        found += [f"{_named(path)}:{node.lineno}: {a.name} as {a.asname}" for a in aliased]
    return found


def test_no_module_of_ours_is_imported_under_another_name():
    aliased = [line for path in _modules(*PACKAGES, "tests", "bench") for line in _aliased_imports(path)]
    assert not aliased, "\n".join(aliased)


def test_the_alias_check_finds_an_alias(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from appliance.budget import components as c\nimport torch.nn.functional as F\n")
    assert [line.split(": ", 1)[1] for line in _aliased_imports(sample)] == ["components as c"]


def test_no_function_is_longer_than_sixty_lines():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in _modules(*PACKAGES)
        for node in _functions(path)
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, "\n".join(long)


def test_build_trainer_is_a_short_setup_that_plans_once():
    path = REPO / "appliance" / "grpo" / "run.py"
    (build,) = [node for node in _functions(path) if node.name == "build_trainer"]
    assert build.end_lineno - build.lineno + 1 < MAX_BUILD_TRAINER_LINES
    source = ast.get_source_segment(path.read_text(encoding="utf-8"), build)
    calls = [node.func for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
    names = [call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", "") for call in calls]
    assert names.count("plan") == 1 and not {"plan_job", "plan_rank"} & set(names), names


@pytest.mark.model
def test_the_loss_is_within_eight_calls_of_the_command_line(tiny_model_dir, tmp_path, fresh_data_dir, monkeypatch):
    """`appliance train FILE` to `policy_loss` on the tiny model: the frames between them, printed."""
    from tiny_model import tiny_job

    from appliance.cli.main import main
    from appliance.grpo import update

    chains = []
    loss = update.policy_loss

    def policy_loss(*args, **kwargs):
        if not chains:
            chains.append(traceback.extract_stack())
        return loss(*args, **kwargs)

    monkeypatch.setattr(update, "policy_loss", policy_loss)
    job = tiny_job(tiny_model_dir, tmp_path, grpo={"steps": 1})
    assert main(["train", str(job), "--data-dir", str(fresh_data_dir)]) == 0
    (stack,) = chains
    start = next(i for i, frame in enumerate(stack) if frame.name == "main" and frame.filename.endswith("cli/main.py"))
    chain = [f"{Path(frame.filename).relative_to(REPO)}:{frame.lineno} {frame.name}" for frame in stack[start:]]
    print("\n".join(["call chain from the command line to the loss:", *chain]), file=sys.stderr)
    assert chain[-1].endswith(" policy_loss") and len(chain) <= MAX_FRAMES_TO_THE_LOSS, chain
