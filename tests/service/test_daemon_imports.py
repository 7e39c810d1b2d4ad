"""The daemon answers its first submission as fast as its hundredth: checking a job loads no heavy library.

A job's check reaches the judge package (the rubric's scale), the planner and
the model store through lazy imports. When one of them pulled in jsonschema
(whose rfc3987 grammar takes 1.5 s to build), the first job with a judge
section waited 3-4 s on a loaded box; torch or transformers would be worse.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "peft", "vllm", "bitsandbytes", "jsonschema", "textual")
CHECK_PATH = (
    "appliance.service.daemon",
    "appliance.judge.rubric",
    "appliance.budget.plan",
    "appliance.budget.device_plans",
    "appliance.budget.shapes",
    "appliance.models.store",
)


def test_the_submission_check_path_imports_no_heavy_library():
    code = (
        "import importlib, json, sys\n"
        f"for name in {CHECK_PATH!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(n for n in {HEAVY!r} if n in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []
