"""Pure parts of the reaper: how a container's age is read."""

from datetime import UTC, datetime

import pytest

from trialflow.sandbox.reaper import LABEL_CREATED_AT, _created_at


def test_age_from_label():
    assert _created_at({"Config": {"Labels": {LABEL_CREATED_AT: "1700000000"}}}) == 1700000000.0


def test_age_falls_back_to_engine_timestamp_with_nanoseconds():
    attrs = {"Config": {"Labels": {LABEL_CREATED_AT: "garbage"}}, "Created": "2026-11-30T03:39:28.961197018Z"}
    want = datetime(2026, 11, 30, 3, 39, 28, 961197, tzinfo=UTC).timestamp()
    assert _created_at(attrs) == want
    assert _created_at({"Config": {"Labels": None}, "Created": "2026-11-30T03:39:28Z"}) == pytest.approx(
        want - 0.961197
    )
