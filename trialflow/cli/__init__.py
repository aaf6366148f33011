"""`trialflow` command line: up, run, status, replay, inspect, report, view, worker, proxy, demo.

Every command reads `TrialflowSettings` once (environment ``TRIALFLOW_*``), and its flags
override those settings. `run` and `replay` start an in-process worker unless
``--external-worker`` says one already polls the Temporal server. Exit codes: 0 when every
trial ended without an error (whatever its reward), 1 when any trial recorded an error
(`demo`: an error other than the agent's own `scaffold_error`; `report`: no results
stored), 2 for bad usage (typer's own).

Modules: `_app` (the typer app, shared options, flags -> settings; the commands are
registered on it below), `_views` (rich tables
and the progress bar), `_trials` (run, status, replay), `_record` (replay --from-record),
`_inspect` (inspect, report), `_view` (view: the trajectory viewer),
`_serve` (worker, proxy), `_demo` (up, demo: the embedded infrastructure).
"""

from trialflow.cli import _demo, _inspect, _serve, _trials, _view
from trialflow.cli._app import app

__all__ = ["app"]

# In this order in `trialflow --help`.
for _command in (
    _trials.run,
    _trials.status,
    _trials.replay,
    _inspect.inspect,
    _inspect.report,
    _view.view,
    _serve.worker,
    _serve.proxy,
    _demo.up,
    _demo.demo,
):
    app.command()(_command)
