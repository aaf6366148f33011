"""The test harness itself: hypothesis profiles (tests/_hypothesis.py) and a light start-up
(tests/conftest.py imports no service or worker code until a fixture needs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests import _hypothesis
from tests._hypothesis import examples, profile_name

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({}, "dev"),
        ({"CI": "true"}, "ci"),
        ({"CI": ""}, "dev"),
        ({"CI": "true", "HYPOTHESIS_PROFILE": "dev"}, "dev"),
        ({"HYPOTHESIS_PROFILE": "ci"}, "ci"),
    ],
)
def test_the_profile_is_named_by_hypothesis_profile_else_by_ci(environ, name):
    assert profile_name(environ) == name


@pytest.fixture
def profile():
    """Load a profile for one test, then the one the session runs under again."""
    before = settings.default
    yield settings.load_profile
    settings.register_profile("_session_before", before)
    settings.load_profile("_session_before")


def test_explicit_counts_follow_the_profile(profile):
    profile("ci")
    assert settings.default.max_examples == 100
    assert [examples(n) for n in (300, 60, 15, 3)] == [300, 60, 15, 3]  # today's counts
    profile("dev")
    assert settings.default.max_examples == _hypothesis.DEV_EXAMPLES
    assert [examples(n) for n in (300, 60, 15, 3)] == [30, 6, 5, 3]  # a tenth, floor 5, never more


def test_a_per_test_count_is_taken_at_decoration_under_the_loaded_profile(profile):
    profile("dev")

    @settings(max_examples=examples(200))
    def dev_test() -> None: ...

    profile("ci")

    @settings(max_examples=examples(200))
    def ci_test() -> None: ...

    assert (
        dev_test._hypothesis_internal_use_settings.max_examples,
        ci_test._hypothesis_internal_use_settings.max_examples,
    ) == (20, 200)  # type: ignore[attr-defined]


def test_a_proxy_only_run_imports_no_worker_stack():
    """Collecting tests/proxy (conftest, its plugins and every proxy test module) imports
    neither temporalio, docker nor the worker: a proxy-only run pays for none of them."""
    probe = (
        "import sys, pytest\n"
        "rc = pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests/proxy'])\n"
        "heavy = ('temporalio', 'docker', 'trialflow.cli._worker', 'trialflow.batch', 'activities', 'workflows.trial')\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])\n"
        "sys.exit(rc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout[-3000:]
