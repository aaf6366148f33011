"""tests/_ci_strict.py: under CI=true a skip for a missing tool fails, other skips stay skips."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

@pytest.mark.skipif(True, reason="Claude Code not installed (infra/setup.sh)")
def test_needs_cli():
    pass

def test_needs_binary():
    pytest.skip("opencode binary not found (tried /x); run infra/setup.sh")

def test_skipped_for_a_reason_of_its_own():
    pytest.skip("this family has no reasoning markup")
"""


# A skipif mark skips in set-up (so it becomes an error), pytest.skip in the call (a failure).
@pytest.mark.parametrize(("ci", "failed", "errors", "skipped"), [("true", 1, 1, 1), ("", 0, 0, 3)])
def test_missing_tool_skips_fail_only_under_ci(pytester, monkeypatch, ci, failed, errors, skipped):
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(SUITE)
    result = pytester.runpytest_inprocess("-p", "tests._ci_strict", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=failed, errors=errors, skipped=skipped)
