"""Under ``CI=true`` (set by .ci/run) a test skipped for a missing tool FAILS.

CI installs everything (infra/setup.sh), so a skip that says a scaffold CLI, a binary or a
package is not installed means the setup is broken, and passing it would hide exactly the
tests that need those tools. Skips for other reasons (a scaffold without a turn limit, a
model family without reasoning markup) stay skips. Loaded through ``pytest_plugins`` in
tests/conftest.py.
"""

from __future__ import annotations

import os
import re

import pytest

MISSING_TOOL = re.compile(r"not installed|binary not found|run infra/setup\.sh|could not import", re.I)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if MISSING_TOOL.search(reason):
            report.outcome = "failed"
            report.longrepr = (
                f"CI=true and a required tool is missing (a skip here hides a broken setup): {reason}"
            )
    return None
