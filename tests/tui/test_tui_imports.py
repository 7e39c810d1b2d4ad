"""tui/ imports nothing heavy: a fresh interpreter that imports every TUI module loads no ML library or engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch",
    "transformers",
    "vllm",
    "peft",
    "bitsandbytes",
    "accelerate",
    "safetensors",
    "numpy",
    "appliance.engines",
    "appliance.models",
    "appliance.judge",
    "appliance.budget",
    "appliance.cli",
    "appliance.grpo.trainer",
    "appliance.grpo.run",
)


def test_tui_imports_no_heavy_module():
    modules = sorted(
        path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".") for path in (REPO / "tui").rglob("*.py")
    )
    assert "tui.app" in modules and "tui.screens.job" in modules
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, capture_output=True, text=True).stdout
    )
    heavy = [name for name in loaded if any(name == h or name.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], f"tui/ pulled in heavy modules: {heavy}"
    assert "tui.app" in loaded and "textual" in loaded
