"""Reaper: removes leaked trialflow containers by label.

A container is "managed" when it carries `trialflow.managed=true`; its age comes from
`trialflow.created_at` (unix seconds), falling back to the engine's own creation time when
the label is missing or malformed. Run periodically by the worker, or by hand:
`python -m trialflow.sandbox.reaper --older-than 3600`.

Edge cases: `older_than_s=0` removes every managed container that matches `labels`;
containers removed concurrently by someone else are not errors; other removal failures
are reported in `ReapReport.failed` rather than stopping the sweep.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping
from datetime import datetime

import docker
import docker.errors

from trialflow.sandbox.base import ReapReport

log = logging.getLogger(__name__)

LABEL_MANAGED = "trialflow.managed"
LABEL_TRIAL_ID = "trialflow.trial_id"
LABEL_CREATED_AT = "trialflow.created_at"
LABEL_VERIFIER_OF = "trialflow.verifier_of"  # a separate verifier's agent sandbox (its name)
LABEL_POD_OF = "trialflow.pod_of"  # a compose service's or namespace holder's sandbox (its name)
LABEL_POD_ROLE = "trialflow.pod_role"  # "service" or "holder" (trialflow.sandbox.pod)
LABEL_SERVICE = "trialflow.service"  # a compose service's name
LABEL_LOCAL_NAMES = "trialflow.local_names"  # on a pod's main: its names on the loopback, comma-separated


def _created_at(attrs: dict) -> float:
    """Our creation label when it parses, else the engine's own ``Created`` time."""
    label = (attrs.get("Config", {}).get("Labels") or {}).get(LABEL_CREATED_AT)
    if label is not None:
        try:
            return float(label)
        except ValueError:
            pass
    # Engine timestamps carry nanoseconds; fromisoformat wants at most micro.
    created = attrs.get("Created", "")
    head, _, frac = created.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def reap_containers(
    client: docker.DockerClient,
    older_than_s: float,
    labels: Mapping[str, str] | None = None,
    *,
    now: float | None = None,
) -> ReapReport:
    """Force-remove managed containers (matching all `labels`) older than `older_than_s`."""
    now = time.time() if now is None else now
    filters = [f"{LABEL_MANAGED}=true", *(f"{k}={v}" for k, v in (labels or {}).items())]
    report = ReapReport()
    # ignore_removed: a sandbox torn down between the listing and the SDK's inspect of each
    # container is gone already, not an error that stops the sweep.
    for container in client.containers.list(all=True, filters={"label": filters}, ignore_removed=True):
        try:
            age = now - _created_at(container.attrs)
            if age < older_than_s:
                continue
            container.remove(force=True, v=True)
            report.removed.append(container.name)
            log.info("reaped %s (age %.0fs)", container.name, age)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as e:
            report.failed[container.name] = str(e)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description="Remove leaked trialflow sandboxes.")
    parser.add_argument("--older-than", type=float, default=3600.0, help="seconds (0 = all)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    report = reap_containers(docker.from_env(), args.older_than)
    print(f"removed {len(report.removed)}, failed {len(report.failed)}")
    for name, err in report.failed.items():
        print(f"  {name}: {err}")


if __name__ == "__main__":
    main()
