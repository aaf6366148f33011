"""Hypothesis profiles: a fast ``dev`` loop by default, today's full counts under ``ci``.

Registered and loaded by tests/conftest.py before any test module is imported:

    dev   the default: a tenth of the examples (``max_examples`` 10), for the edit-test loop
    ci    hypothesis' own count (100) and every test's own count as written; selected by
          ``HYPOTHESIS_PROFILE=ci``, and by default when ``CI`` is set (.ci/run, infra/test.sh)

``HYPOTHESIS_PROFILE`` names the profile; unset, ``CI`` decides. An unknown name is an error
(hypothesis' own ``InvalidArgument``), not a silent fall-back.

A test that asks for a count of its own writes ``@settings(max_examples=examples(300))``:
``examples`` scales the count written for ``ci`` to the loaded profile, so an explicit
count follows the profile instead of overriding it (``settings(max_examples=300)`` alone
would run 300 in every profile). Under ``dev`` a count never drops below ``DEV_FLOOR``
(or the count itself, when that is smaller), so a test with few, costly examples still runs
a handful.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import settings

CI_EXAMPLES = 100  # hypothesis' default: the counts the tests were written for
DEV_EXAMPLES = 10
DEV_FLOOR = 5

settings.register_profile("ci", max_examples=CI_EXAMPLES)
settings.register_profile("dev", max_examples=DEV_EXAMPLES)


def profile_name(environ: Mapping[str, str] = os.environ) -> str:
    """The profile to load: ``HYPOTHESIS_PROFILE`` if set, else ``ci`` when ``CI`` is set
    (to anything but an empty string), else ``dev``."""
    if name := environ.get("HYPOTHESIS_PROFILE"):
        return name
    return "ci" if environ.get("CI") else "dev"


def load_profile() -> str:
    name = profile_name()
    settings.load_profile(name)
    return name


def examples(ci_count: int) -> int:
    """``ci_count`` (the count under ``ci``) scaled to the loaded profile's ``max_examples``:
    unchanged under ``ci``; under ``dev`` a tenth, at least ``min(DEV_FLOOR, ci_count)``."""
    scaled = round(ci_count * settings.default.max_examples / CI_EXAMPLES)
    if scaled >= ci_count:
        return scaled
    return max(scaled, min(DEV_FLOOR, ci_count))
