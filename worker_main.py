"""Entry point of one trialflow worker process: ``python worker_main.py [--flag value ...]``.

Wiring only: settings from flags and ``TRIALFLOW_*`` environment variables and the event
loop; the process itself (Temporal workers, in-process proxy, Docker backend, the drain on
SIGTERM/SIGINT) is `trialflow.cli._worker.WorkerProcess`, run by `trialflow.cli._worker.serve`. One flag per
`TrialflowSettings` field (``--temporal-address``, ``--replica-urls URL`` repeatable, ...);
flags override ``TRIALFLOW_*`` environment variables.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import typing
from collections.abc import Sequence

from proxy import eventloop
from trialflow.cli._worker import serve
from trialflow.cluster import ClusterConfigError, check_fleet_store, temporal_tls
from trialflow.settings import TrialflowSettings, load_settings


def parse_args(argv: Sequence[str] | None = None) -> TrialflowSettings:
    """One flag per settings field; list fields are repeatable flags, dict fields JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, field in TrialflowSettings.model_fields.items():
        origin = typing.get_origin(field.annotation)
        flag = "--" + name.replace("_", "-")
        if origin is list:
            parser.add_argument(flag, dest=name, action="append")
        elif origin is dict:
            parser.add_argument(flag, dest=name, type=json.loads)
        else:
            parser.add_argument(flag, dest=name)
    return load_settings(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = parse_args(argv)
    try:  # one line, not a traceback: a cluster setting the worker cannot start with
        check_fleet_store(settings)
        temporal_tls(settings)
    except ClusterConfigError as err:
        sys.exit(f"error: {err}")
    eventloop.run(serve(settings))


if __name__ == "__main__":
    main()
