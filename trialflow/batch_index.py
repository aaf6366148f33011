"""Which store a batch used, recorded on this machine when `trialflow run` submits it, so
`inspect` and `report` read the batch's results from that store without being told again
(issue 13). One small JSON file per batch under `<index_dir>` (default
`~/.cache/trialflow/batches`, `TRIALFLOW_BATCH_INDEX` overrides): the store's location only,
never its keys. A trial id ``trial-{batch}-...`` names its batch, so a trial is found too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trialflow.settings import TrialflowSettings

STORE_FIELDS = ("s3_endpoint", "s3_bucket", "s3_prefix", "store_dir")


def index_dir() -> Path:
    default = Path.home() / ".cache" / "trialflow" / "batches"
    return Path(os.environ.get("TRIALFLOW_BATCH_INDEX", default))


def record(settings: TrialflowSettings, batch_id: str, root: Path | None = None) -> Path:
    """Remember where `batch_id`'s results go (a relative store_dir is made absolute)."""
    where = {k: getattr(settings, k) for k in STORE_FIELDS}
    if where["store_dir"] is not None:
        where["store_dir"] = str(Path(where["store_dir"]).resolve())
    path = (root or index_dir()) / f"{batch_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"batch_id": batch_id, "store": where}, default=str))
    return path


def store_of(batch_id: str, root: Path | None = None) -> dict | None:
    """The recorded store fields of `batch_id`, or None when this machine never ran it."""
    path = (root or index_dir()) / f"{batch_id}.json"
    try:
        return json.loads(path.read_text())["store"]
    except (OSError, ValueError, KeyError):
        return None


def batch_of_trial(trial_id: str, root: Path | None = None) -> str | None:
    """The recorded batch whose trial ids start like `trial_id` (longest match wins)."""
    folder = root or index_dir()
    if not folder.is_dir():
        return None
    names = [p.stem for p in folder.glob("*.json") if trial_id.startswith(f"trial-{p.stem}-")]
    return max(names, key=len) if names else None
