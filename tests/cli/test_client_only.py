"""On a box or workstation with only the client installed (the appliance wheel and its own dependencies, no
training stack), every command that needs that stack says so in one line, never a ModuleNotFoundError traceback.

The client install is made here by hiding the `server` extra's packages from the import system (what pip's
client lock leaves out); tests/client installs the real client wheelhouse where images/ci-build-check built one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SERVER_ONLY = sorted(
    {re.split(r"[=<>\[; ]", requirement)[0].replace("-", "_").lower() for requirement in
     PYPROJECT["project"]["optional-dependencies"]["server"] + ["vllm"]}
    - {re.split(r"[=<>\[; ]", requirement)[0].replace("-", "_").lower() for requirement in
       PYPROJECT["project"]["dependencies"]}
)  # fmt: skip
IMPORT_NAMES = {"pyyaml": "yaml"}
CLIENT_ONLY = f"""
import importlib.abc, sys
hidden = {sorted(IMPORT_NAMES.get(name, name) for name in SERVER_ONLY)!r}
class ClientInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, ClientInstall())
from appliance.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
# Each with input that is right, so that only the missing stack can stop it.
COMMANDS = [
    ["models", "import", "{model}", "--name", "imported"],
    ["models", "provision-demo", "--data-dir", "{tmp}/empty"],
    ["train", "{examples}/multiply.yaml"],
    ["eval", "{examples}/multiply.yaml"],
    ["judge", "eval", "shipped"],
    ["serve", "--socket", "{tmp}/s.sock", "--metrics-addr", "127.0.0.1:0"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(argv[:2]) for argv in COMMANDS])
def test_a_command_that_needs_the_training_stack_says_so_in_one_line(
    argv: list[str], tmp_path: Path, fresh_data_dir: Path, demo_model_dir: Path
):
    argv = [arg.format(tmp=tmp_path, examples=REPO_ROOT / "examples", model=demo_model_dir) for arg in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "APPLIANCE_DATA_DIR": str(fresh_data_dir)}

    result = subprocess.run(
        [sys.executable, "-c", CLIENT_ONLY, *argv], capture_output=True, text=True, env=env, timeout=120
    )

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: 'appliance {argv[0]}' needs the training stack ("), lines


def test_the_client_commands_still_run_without_the_training_stack(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    missing = tmp_path / "none.sock"

    models = subprocess.run(
        [sys.executable, "-c", CLIENT_ONLY, "models", "list", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    jobs = subprocess.run(
        [sys.executable, "-c", CLIENT_ONLY, "jobs", "list", "--socket", str(missing)],
        capture_output=True,
        text=True,
        env=env,
    )
    verify = subprocess.run(
        [sys.executable, "-c", CLIENT_ONLY, "bundle", "verify", str(tmp_path), "--state-dir", str(tmp_path / "s")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip

    assert jobs.returncode == 1 and jobs.stderr.startswith(f"error: no appliance daemon answers on {missing}")
    assert verify.returncode == 1 and "MANIFEST.sha256 is missing" in verify.stderr
    assert models.returncode == 0 and "no models in" in models.stdout, models.stderr
    assert "Traceback" not in jobs.stderr + verify.stderr + models.stderr
