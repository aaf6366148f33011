"""The trajectory viewer's URL scheme (stable: the Temporal UI's trial details link here) and
the Temporal UI's workflow URL (each trial page links back there). Pure, stdlib only, so a
workflow or activity can build a link without importing the server.

    /                                   batches in the store
    /batch/{batch_id}                   a batch's trials
    /trial/{trial_id}[?batch=B]         one trial: result, attempts, turns, logs, verifier, replays
    /trial/{trial_id}/turn/{n}[?...]    one turn's exact tokens (n from 1; attempt=, step= pick
                                        the trajectory, default the last attempt's own session)
    /trial/{trial_id}/segment/{s}[?...] one segment's tokens, paged (offset=)

Ids are percent-encoded as one path segment (a ``/`` in an id cannot change the route). The
batch query parameter is only a shortcut: without it the viewer finds the batch from the
trial id (``trial-{batch}-{task}-{sample}``) in the store.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

DEFAULT_VIEWER_URL = "http://127.0.0.1:8234"
DEFAULT_TEMPORAL_UI_URL = "http://127.0.0.1:8233"


def _seg(value: str) -> str:
    return quote(value, safe="")


def _query(**params: object) -> str:
    kept = {k: str(v) for k, v in params.items() if v is not None}
    return f"?{urlencode(kept)}" if kept else ""


def batch_url(batch_id: str, base: str = "") -> str:
    """A batch's page. ``base``: the viewer's address (``settings.viewer_url``); "" gives the
    path alone (links inside the viewer)."""
    return f"{base.rstrip('/')}/batch/{_seg(batch_id)}"


def trial_url(trial_id: str, base: str = "", batch_id: str | None = None) -> str:
    """A trial's page (the trial id is its Temporal workflow id). The one function the
    Temporal UI's details use to link a trial to the viewer."""
    return f"{base.rstrip('/')}/trial/{_seg(trial_id)}{_query(batch=batch_id)}"


def turn_url(
    trial_id: str, turn: int, *, batch_id: str | None = None, attempt: int | None = None,
    step: str | None = None, base: str = "",
) -> str:  # fmt: skip
    """Turn ``turn`` (from 1) of one attempt's (or one step's) trajectory."""
    return (
        f"{base.rstrip('/')}/trial/{_seg(trial_id)}/turn/{turn}"
        f"{_query(batch=batch_id, attempt=attempt, step=step)}"
    )


def segment_url(
    trial_id: str, segment: int, *, batch_id: str | None = None, attempt: int | None = None,
    step: str | None = None, offset: int | None = None, base: str = "",
) -> str:  # fmt: skip
    """Segment ``segment`` (from 0) of one attempt's (or step's) trajectory, from token ``offset``."""
    return (
        f"{base.rstrip('/')}/trial/{_seg(trial_id)}/segment/{segment}"
        f"{_query(batch=batch_id, attempt=attempt, step=step, offset=offset)}"
    )


def workflow_ui_url(workflow_id: str, temporal_ui_url: str, namespace: str = "default") -> str:
    """The workflow's page in the Temporal UI (its latest run)."""
    return f"{temporal_ui_url.rstrip('/')}/namespaces/{_seg(namespace)}/workflows/{_seg(workflow_id)}"
