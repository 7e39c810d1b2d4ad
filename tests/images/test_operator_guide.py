"""docs/operator-guide.md against the files it describes: the container's TCP control port drop-in repeats
the image's own arguments (an Exec= drop-in replaces them), the commands it gives exist, and every command
block either runs as written (the build machine's here, the box's on a newcomer's box: tests/box_support.py)
or says in its marker what it needs that the test lacks."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDE = (REPO_ROOT / "docs" / "operator-guide.md").read_text()


def image_arguments() -> list[str]:
    command = [line for line in (REPO_ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD [")]
    assert len(command) == 1, command
    return json.loads(command[0][len("CMD ") :])


def test_every_drop_in_keeps_the_image_arguments_and_adds_only_options_the_daemon_has():
    exec_lines = [line[len("Exec=") :].split() for line in GUIDE.splitlines() if line.startswith("Exec=")]
    shown = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--help"], capture_output=True, text=True, cwd=REPO_ROOT
    )

    assert len(exec_lines) >= 2 and shown.returncode == 0, shown.stderr
    for arguments in exec_lines:
        assert arguments[: len(image_arguments())] == image_arguments()  # Exec= replaces them: it repeats them
        added = [word for word in arguments[len(image_arguments()) :] if word.startswith("--")]
        assert [option for option in added if not re.search(rf"^\s+{option}\b", shown.stdout, re.MULTILINE)] == []


def test_the_control_port_drop_in_adds_the_port_and_its_token():
    [arguments] = [line.split() for line in GUIDE.splitlines() if line.startswith("Exec=") and "--control-addr" in line]
    added = arguments[len(image_arguments()) :]
    assert added == ["--control-addr", "0.0.0.0:9470", "--control-token-file", "/run/secrets/control.token"]
    assert "Volume=/etc/appliance/control.token:/run/secrets/control.token:ro,Z" in GUIDE
    assert re.search(r"^PublishPort=[0-9.]+:9470:9470$", GUIDE, re.MULTILINE)
    assert "chown 10001:10001 /etc/appliance/control.token" in GUIDE


def test_the_gpu_smoke_commands_of_the_guide_use_options_it_has():
    shown = subprocess.run(
        [sys.executable, REPO_ROOT / "images" / "gpu-smoke", "--help"], capture_output=True, text=True
    )
    commands = [line.split("#")[0] for line in GUIDE.splitlines() if "appliance/gpu-smoke " in line]
    used = {option for line in commands for option in re.findall(r"(--[a-z-]+)", line)}

    assert shown.returncode == 0 and len(commands) >= 3
    assert {"--student", "--judge", "--dry-run"} <= used
    assert sorted(option for option in used if f"  {option}" not in shown.stdout) == []


# ----- every command block: run as written, or marked with what it needs ------------------------------------

BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- guide-test: (.+?) -->\n\Z")
RUNNERS = {"build", "box", "box as alice", "box, after install", "box, last"}
PINENTRY = """#!/bin/sh
# The administrator typing a passphrase into gpg's prompt (the human boundary).
echo "OK ready"
while read -r line; do
  case "$line" in
    GETPIN*) echo "D a long test passphrase"; echo "OK" ;;
    BYE*) echo "OK"; exit 0 ;;
    *) echo "OK" ;;
  esac
done
"""


def guide_blocks() -> list[tuple[str, str]]:
    """(marker, code) of every bash block of the guide, in order; the marker is '' where there is none."""
    found = []
    for match in BLOCK.finditer(GUIDE):
        marker = MARKER.search(GUIDE[: match.start()])
        found.append((marker.group(1) if marker else "", match.group(1)))
    return found


def test_every_command_block_is_run_by_a_test_or_says_what_it_needs():
    blocks = guide_blocks()

    unmarked = [code.splitlines()[0] for marker, code in blocks if not marker]
    unknown = [marker for marker, _ in blocks if marker and marker not in RUNNERS and not marker.startswith("needs ")]
    vague = [marker for marker, _ in blocks if marker.startswith("needs ") and len(marker.split()) < 4]

    assert len(blocks) >= 20 and (unmarked, unknown, vague) == ([], [], [])
    assert sum(marker.startswith("box") for marker, _ in blocks) >= 8


def run_order(blocks: list[tuple[str, str]]) -> list[tuple[int, str, str]]:
    """The box's blocks in the guide's order, except those that need the install first or must come last."""
    phase = {"box": 0, "box as alice": 0, "box, after install": 1, "box, last": 2}
    chosen = [(number, marker, code) for number, (marker, code) in enumerate(blocks, 1) if marker in phase]
    return sorted(chosen, key=lambda block: (phase[block[1]], block[0]))


@pytest.mark.image
def test_the_guide_runs_as_written_on_a_newcomers_box(tmp_path: Path, signing_key, demo_model_dir: Path):
    from box_support import make_bundle, unpack_box

    wheelhouse = os.environ.get("APPLIANCE_CLIENT_WHEELHOUSE")
    if not wheelhouse:
        pytest.skip("needs the client wheelhouse images/ci-build-check builds (APPLIANCE_CLIENT_WHEELHOUSE)")
    blocks = guide_blocks()
    report = []

    # The build machine's blocks, here, with the test's model for the Hugging Face folders.
    build = tmp_path / "build"
    (build / "gnupg").mkdir(parents=True, mode=0o700)
    (build / ".venv").symlink_to(REPO_ROOT / ".venv")
    (build / "pinentry").write_text(PINENTRY)
    (build / "pinentry").chmod(0o755)
    (build / "gnupg" / "gpg-agent.conf").write_text(f"pinentry-program {build / 'pinentry'}\n")
    env = {**os.environ, "GNUPGHOME": str(build / "gnupg"), "PYTHONPATH": str(REPO_ROOT)}
    try:
        for number, (marker, code) in enumerate(blocks, 1):
            if marker == "build":
                code = code.replace("/path/to/Qwen2.5-7B-Instruct", str(demo_model_dir))
                code = code.replace("/path/to/Qwen3-8B", str(demo_model_dir))
                started = time.monotonic()
                # At a terminal, as the administrator types (gpg asks to confirm the new key's name there).
                terminal = [
                    "script",
                    "--quiet",
                    "--return",
                    "--command",
                    shlex.join(["bash", "-euo", "pipefail", "-c", code]),
                ]
                done = subprocess.run([*terminal, "/dev/null"], cwd=build, env=env, input="y\n",
                                      capture_output=True, text=True, timeout=600)  # fmt: skip
                assert done.returncode == 0, f"block {number}:\n{code}\n{done.stdout}\n{done.stderr}"
                report.append((number, marker, time.monotonic() - started, done.stdout))
    finally:
        subprocess.run(["gpgconf", "--homedir", str(build / "gnupg"), "--kill", "gpg-agent"], check=False)
    assert (build / "bundle-signing-key.gpg").stat().st_size > 0
    assert {"Qwen2.5-7B-Instruct", "Qwen3-8B"} <= set(report[0][3].split())

    # The box: two bundles of this checkout (0.1.0 and 0.2.0) and the key, carried over; an operator account.
    box = unpack_box(tmp_path)
    try:
        for version, folder in (("0.1.0", "appliance-bundle"), ("0.2.0", "appliance-bundle-0.2.0")):
            make_bundle(version, box.path(f"/root/{folder}"), signing_key, tmp_path, client=Path(wheelhouse))
        box.path("/root/bundle-signing-key.gpg").write_bytes(signing_key.keyring.read_bytes())
        assert box.run("useradd --create-home alice").returncode == 0
        outputs = {}
        for number, marker, code in run_order(blocks):
            command = f"cd /root && bash -euo pipefail -c {shlex.quote(code)}"
            if marker == "box as alice":
                command = f"sudo -u alice -H bash -euo pipefail -c {shlex.quote('cd ~ && ' + code)}"
            started = time.monotonic()
            done = box.run(command, timeout=900)
            assert done.returncode == 0, f"block {number} ({marker}):\n{code}\n{done.stdout}\n{done.stderr}"
            outputs[number] = done.stdout
            report.append((number, marker, time.monotonic() - started, done.stdout))
    finally:
        box.kill_everything()
    for number, marker, seconds, _ in sorted(report):
        print(f"guide block {number:2d} ({marker}): ran, {seconds:.1f} s")
    for number, (marker, _) in enumerate(blocks, 1):
        if marker.startswith("needs "):
            print(f"guide block {number:2d}: {marker}")

    text = "\n".join(outputs.values())
    assert "installed 0.1.0" in text and "upgrade 0.1.0 -> 0.2.0" in text and "rollback 0.2.0 -> 0.1.0" in text
    assert "appliance 0.1.0" in text  # sudo appliance --version: the shim's client
    assert "no models in /var/lib/appliance-models/current" in text  # sudo appliance models list: the container
    assert "uninstalled 0.1.0, 0.2.0" in text or "uninstalled 0.2.0, 0.1.0" in text
