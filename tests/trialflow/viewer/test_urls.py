"""The viewer's URL scheme: stable paths (the Temporal UI links to them), ids as one path
segment whatever they hold, and the exported surface pinned."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from trialflow import viewer
from trialflow.viewer import batch_url, segment_url, trial_url, turn_url, workflow_ui_url


def test_surface_pinned():
    assert sorted(viewer.__all__) == [
        "DEFAULT_TEMPORAL_UI_URL", "DEFAULT_VIEWER_URL", "batch_url", "segment_url",
        "trial_url", "turn_url", "workflow_ui_url",
    ]  # fmt: skip


def test_paths():
    assert trial_url("trial-b1-create-file-0") == "/trial/trial-b1-create-file-0"
    assert trial_url("trial-b1-x-0", "http://127.0.0.1:8234/") == "http://127.0.0.1:8234/trial/trial-b1-x-0"
    assert trial_url("t", batch_id="b 1") == "/trial/t?batch=b+1"
    assert batch_url("b1", "http://h:1") == "http://h:1/batch/b1"
    assert turn_url("t", 3, attempt=2) == "/trial/t/turn/3?attempt=2"
    assert turn_url("t", 1, step="s/1") == "/trial/t/turn/1?step=s%2F1"
    assert segment_url("t", 0, offset=4000) == "/trial/t/segment/0?offset=4000"


def test_an_id_stays_one_segment():
    hostile = "../batch/x?y=<script>#"
    path = urlsplit(trial_url(hostile)).path
    assert path.count("/") == 2 and unquote(path.split("/")[2]) == hostile
    assert "<" not in trial_url(hostile) and "#" not in trial_url(hostile)


def test_temporal_ui_link():
    assert (
        workflow_ui_url("trial-b-t-0", "http://127.0.0.1:8233/", "default")
        == "http://127.0.0.1:8233/namespaces/default/workflows/trial-b-t-0"
    )


def test_settings_carry_the_addresses(monkeypatch):
    from trialflow.settings import load_settings

    monkeypatch.setenv("TRIALFLOW_VIEWER_URL", "http://10.0.0.5:9000")
    s = load_settings()
    assert s.viewer_url == "http://10.0.0.5:9000"
    assert s.temporal_ui_url == viewer.DEFAULT_TEMPORAL_UI_URL
