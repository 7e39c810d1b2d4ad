"""The per-tier time budget (tests/tier_budget.py) fails a run whose tier outgrows it, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

pytest_plugins = ["pytester"]

INNER_TESTS = """
import time
import pytest

@pytest.mark.model
def test_model_tier():
    time.sleep(0.3)

def test_fast_tier():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch, model_budget: float, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makeconftest(
        "import tier_budget\n"
        f"tier_budget.TIER_BUDGET_SECONDS['model'] = {model_budget}\n"
        "pytest_plugins = ['tier_budget']\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'model: m')\n"
    )
    pytester.makepyfile(INNER_TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_a_tier_over_its_budget_fails_the_run_and_says_which(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, model_budget=0.1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*model:*OVER BUDGET*", "*tier(s) model over budget*"])


def test_tiers_within_budget_pass_and_print_their_time(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, model_budget=60.0)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*time per tier*", "* model: *0 s /    60 s", "*  fast: *"])
    assert "OVER BUDGET" not in result.stdout.str()


def test_modules_run_heaviest_tier_first_and_stay_whole(pytester, monkeypatch):
    # test_b holds a fast test and a model one: the whole module goes before test_a's fast tests, in its own order.
    pytester.makepyfile(
        test_a="def test_one():\n    pass\n\ndef test_two():\n    pass\n",
        test_b="import pytest\n\ndef test_light():\n    pass\n\n@pytest.mark.model\ndef test_heavy():\n    pass\n",
    )
    result = _run(pytester, monkeypatch, 60.0, "-v", "test_a.py", "test_b.py")
    ran = [line.split(" ")[0] for line in result.stdout.lines if " PASSED" in line]
    assert result.ret == pytest.ExitCode.OK
    assert ran == ["test_b.py::test_light", "test_b.py::test_heavy", "test_a.py::test_one", "test_a.py::test_two"]


def test_parallel_workers_report_their_tiers_to_one_summary(pytester, monkeypatch):
    # `make test` runs the suite on pytest-xdist workers: their tests' seconds reach the controller's budget check.
    result = _run(pytester, monkeypatch, 0.1, "-n", "2", "--dist", "loadfile")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*model:*OVER BUDGET*", "*tier(s) model over budget*"])
