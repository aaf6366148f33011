"""The trajectory viewer (`trialflow view`): a local web page over the store.

This package exports only the URL scheme (pure, stdlib only: a workflow or activity links a
trial to the viewer with `trial_url`, without importing the server). The parts: `_urls` (the
routes), `_data` (reads the store into view models: the only I/O besides the server), `_render`
(pure HTML of the view models, everything escaped), `_server` (the aiohttp app and its error
pages).
"""

from trialflow.viewer._urls import (
    DEFAULT_TEMPORAL_UI_URL,
    DEFAULT_VIEWER_URL,
    batch_url,
    segment_url,
    trial_url,
    turn_url,
    workflow_ui_url,
)

__all__ = [
    "DEFAULT_TEMPORAL_UI_URL",
    "DEFAULT_VIEWER_URL",
    "batch_url",
    "segment_url",
    "trial_url",
    "turn_url",
    "workflow_ui_url",
]
