"""The operator client on the oldest and newest CPython it supports (3.9, 3.13; pyenv's on this machine).

Installed offline the way the operator guide says (the client lock's wheels with --require-hashes, then
this checkout's own wheel), it imports the TUI and the client, `appliance jobs list` against a missing
socket fails with the one clean error, and the TUI starts headless and says the daemon is unreachable.
vermin, a minimum-version checker, reads every module the client imports and must say 3.9.

The client wheelhouse holds compiled wheels per Python (pydantic-core, PyYAML) that only PyPI serves, so
images/ci-build-check builds it (images/build-wheelhouse client) and names it in
APPLIANCE_CLIENT_WHEELHOUSE; elsewhere the install tests skip. Nothing here opens a network connection.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
# What a workstation runs: `appliance jobs ...` and `appliance-tui`.
CLIENT_ENTRY_MODULES = ["tui.app", "appliance.cli.main", "appliance.cli.jobs_cmd", "appliance.service.client"]

VERMIN = "import sys, vermin; sys.exit(vermin.main())"  # vermin has no __main__ module
VERMIN_FLAGS = ["-t=3.9-", "--no-tips", "--violations"]
HEADLESS_TUI = """
import asyncio, sys
from tui.app import ApplianceApp

async def main():
    app = ApplianceApp(sys.argv[1])
    async with app.run_test(size=(120, 30)) as pilot:
        for _ in range(150):
            await pilot.pause(0.1)
            text = "\\n".join(strip.text for strip in app.screen._compositor.render_strips())
            if "Daemon unreachable" in text:
                print("unreachable banner shown")
                return
    sys.exit("no 'Daemon unreachable' banner after 15 s")

asyncio.run(main())
"""


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, **kwargs)


def offline_env() -> dict[str, str]:
    """pip with no index, no find-links and no config of this machine: only what the test names."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "PYTHON"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def interpreter(minor: str) -> Path:
    found = sorted(PYENV_VERSIONS.glob(f"{minor}.*/bin/python{minor}"))
    if not found:
        pytest.skip(
            f"no CPython {minor} on this machine (looked for {PYENV_VERSIONS}/{minor}.*; pyenv install {minor})"
        )
    return found[-1]


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    named = os.environ.get("APPLIANCE_CLIENT_WHEELHOUSE")
    if not named:
        pytest.skip(
            "no client wheelhouse: images/ci-build-check builds one (images/build-wheelhouse client, from PyPI) "
            "and names it in APPLIANCE_CLIENT_WHEELHOUSE"
        )
    path = Path(named)
    assert (path / "requirements-3.9.txt").is_file(), f"{path} is not a client wheelhouse (no requirements-3.9.txt)"
    return path


@pytest.fixture(scope="module")
def app_wheel(tmp_path_factory) -> Path:
    """This checkout's own wheel (not the wheelhouse's, which may be older than the code under test)."""
    out = tmp_path_factory.mktemp("app-wheel")
    built = run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", out,
        REPO_ROOT, env=offline_env(), timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return next(out.glob("appliance-*.whl"))


@pytest.mark.parametrize("minor", ["3.9", "3.13"])
def test_the_client_installs_offline_and_runs(minor: str, wheelhouse: Path, app_wheel: Path, tmp_path: Path):
    python = interpreter(minor)
    venv = tmp_path / "client"
    run(python, "-m", "venv", venv).check_returncode()
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    env = offline_env()

    locked = run(*pip, "--require-hashes", "--find-links", wheelhouse, "-r", wheelhouse / f"requirements-{minor}.txt",
                 env=env, timeout=300)  # fmt: skip
    assert locked.returncode == 0, locked.stderr
    own = run(*pip, app_wheel, env=env, timeout=300)
    assert own.returncode == 0, own.stderr
    check = run(venv / "bin" / "python", "-m", "pip", "check", env=env)
    assert check.returncode == 0, check.stdout

    imported = run(venv / "bin" / "python", "-c", "import tui.app, appliance.service.client", env=env, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    missing = tmp_path / "none.sock"
    jobs = run(venv / "bin" / "appliance", "jobs", "list", "--socket", missing, env=env, timeout=60)
    assert jobs.returncode == 1, jobs.stdout + jobs.stderr
    assert jobs.stderr.startswith(f"error: no appliance daemon answers on {missing}"), jobs.stderr
    assert "Traceback" not in jobs.stderr
    tui = run(venv / "bin" / "python", "-c", HEADLESS_TUI, missing, env=env, cwd=tmp_path, timeout=60)
    assert tui.returncode == 0 and "unreachable banner shown" in tui.stdout, tui.stderr[-3000:]
    torch = run(venv / "bin" / "python", "-c", "import torch", env=env, cwd=tmp_path)
    assert torch.returncode != 0  # the client brings no training stack


def client_module_files() -> list[str]:
    """Every appliance/tui module a workstation loads, listed by a fresh interpreter that imports the entries."""
    listing = (
        "import sys\n"
        f"for name in {CLIENT_ENTRY_MODULES!r}: __import__(name)\n"
        "print('\\n'.join(sorted(m.__file__ for k, m in sys.modules.items() if k.split('.')[0] in ('appliance', 'tui'))))"
    )
    listed = run(sys.executable, "-c", listing, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def test_vermin_says_the_client_needs_no_newer_than_3_9():
    if importlib.util.find_spec("vermin") is None:
        message = "vermin is not installed (the dev extra has it: pip install -e '.[cpu,dev]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    files = client_module_files()
    assert any(path.endswith("tui/polling.py") for path in files) and len(files) > 20, files
    checked = run(sys.executable, "-c", VERMIN, *VERMIN_FLAGS, *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_vermin_as_called_here_refuses_a_module_that_needs_3_10(tmp_path: Path):
    if importlib.util.find_spec("vermin") is None:
        pytest.skip("vermin is not installed")
    newer = tmp_path / "newer.py"
    newer.write_text("def kind(x):\n    match x:\n        case 1:\n            return 'one'\n")
    checked = run(sys.executable, "-c", VERMIN, *VERMIN_FLAGS, newer)
    assert checked.returncode != 0 and "3.10" in checked.stdout, checked.stdout + checked.stderr
