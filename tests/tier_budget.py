"""Per-tier time budgets: the summed seconds of each test tier, printed every run, failed when over budget.

CI's whole run must stay under 40 minutes on a 2-core box; a tier that outgrows its budget fails the run
here, naming the tier, instead of pushing CI past its limit unnoticed. Budgets are about 1.5x a measured
run, so the box's own noise does not fail a run.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

# Summed test seconds (setup + call + teardown) per tier; a test belongs to the first tier it is marked with.
TIER_BUDGET_SECONDS = {"slow": 1500.0, "vllm": 600.0, "image": 900.0, "model": 2400.0, "fast": 600.0}

_spent: dict[str, float] = defaultdict(float)


def tier_of(keywords) -> str:
    return next((tier for tier in TIER_BUDGET_SECONDS if tier != "fast" and tier in keywords), "fast")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _spent[tier_of(report.keywords)] += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    over = [tier for tier, spent in _spent.items() if spent > TIER_BUDGET_SECONDS[tier]]
    terminalreporter.section("time per tier (summed test seconds / budget)")
    for tier, budget in TIER_BUDGET_SECONDS.items():
        if tier in _spent:
            flag = "  OVER BUDGET" if tier in over else ""
            terminalreporter.write_line(f"{tier:>6}: {_spent[tier]:7.0f} s / {budget:5.0f} s{flag}")
    if over:
        terminalreporter.write_line(
            f"tier(s) {', '.join(over)} over budget: make the new tests smaller or move them to a cheaper tier"
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    if any(spent > TIER_BUDGET_SECONDS[tier] for tier, spent in _spent.items()) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
