"""Per-tier time budgets: the summed seconds of each test tier, printed every run, failed when over budget.

CI's whole run must stay under 40 minutes on a 2-core box; a tier that outgrows its budget fails the run
here, naming the tier, instead of pushing CI past its limit unnoticed. Budgets are about 1.5x a measured
run, so the box's own noise does not fail a run.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

# Summed test seconds (setup + call + teardown) per tier; a test belongs to the first tier it is marked with.
# `make test` runs two workers on a 2-core box, each with one torch thread, beside the image build: a test's
# seconds are about twice what it takes alone, and the budgets are about 1.5x such a run (bench/README.md,
# "The test suite's time").
TIER_BUDGET_SECONDS = {"slow": 2400.0, "vllm": 600.0, "image": 900.0, "model": 2400.0, "fast": 900.0}

# Whole modules run in this order of their heaviest tier, the learning tests first: `make test` hands whole files
# to its parallel workers in this order, and the longest files given out first finish beside the many short ones
# instead of after them.
RUN_ORDER = ("slow", "image", "vllm", "model", "fast")

_spent: dict[str, float] = defaultdict(float)


def tier_of(keywords) -> str:
    return next((tier for tier in TIER_BUDGET_SECONDS if tier != "fast" and tier in keywords), "fast")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    heaviest: dict[str, int] = {}
    for item in items:
        heaviest[module(item)] = min(
            RUN_ORDER.index(tier_of(item.keywords)), heaviest.get(module(item), len(RUN_ORDER))
        )
    first_seen = {name: index for index, name in enumerate(dict.fromkeys(map(module, items)))}
    items.sort(key=lambda item: (heaviest[module(item)], first_seen[module(item)]))


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
