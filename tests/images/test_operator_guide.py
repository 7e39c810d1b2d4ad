"""docs/operator-guide.md against the files it describes: the container's TCP control port drop-in repeats
the image's own arguments (an Exec= drop-in replaces them), and the commands it gives exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDE = (REPO_ROOT / "docs" / "operator-guide.md").read_text()


def image_arguments() -> list[str]:
    command = [line for line in (REPO_ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD [")]
    assert len(command) == 1, command
    return json.loads(command[0][len("CMD ") :])


def test_the_control_port_drop_in_keeps_the_image_arguments_and_adds_the_port():
    exec_lines = [line for line in GUIDE.splitlines() if line.startswith("Exec=")]
    assert len(exec_lines) == 1, exec_lines
    arguments = exec_lines[0][len("Exec=") :].split()

    assert arguments[: len(image_arguments())] == image_arguments()
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
