"""Artifacts: files a task declares (task.toml `artifacts`, plus Harbor's conventional
/logs/artifacts) copied out of the sandbox after verification, as Harbor collects them.

Each entry lands at its `relative_path` (the destination, else the source without its
root: `/var/log/app` -> `var/log/app`); `exclude` patterns (fnmatch, on paths relative to
a directory source, and on their basenames) drop files. A source that does not exist is
recorded as missing, never an error (the convention dir usually does not). Entries whose
outputs overlap an earlier one are skipped, as Harbor keeps the first claim. The result is
a manifest, one row per entry: source, destination, status ("ok" | "missing" |
"skipped" | "failed": the source was a link the download refused), files. The copies are
streamed and share one budget of bytes and entries (`trialflow.sandbox.transfer`): over
it, `OutputBudgetExceeded` ends the verification (a 1 GB sparse file is refused by its
tar header, before a byte of it is read).

`upload_artifacts` puts collected artifacts into a separate verifier sandbox, as Harbor
0.25 re-materializes them: each entry at its original source path (never its
destination), a directory replacing what the verifier image has there. What goes in is a
sanitized copy (tarfile's `data` filter: setuid/setgid bits cleared; special files and
links that leave the artifact skipped), so the agent's files land only inside the paths
the task declared.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import shlex
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Literal, TypedDict

from trialflow.errors import SandboxLost, SandboxPathNotFound
from trialflow.sandbox.base import Sandbox
from trialflow.sandbox.transfer import Allowance, TransferLimits
from trialflow.task_config import ArtifactConfig

log = logging.getLogger(__name__)


class ArtifactRow(TypedDict):
    """One manifest row (written as JSON next to the attempt's logs)."""

    source: str
    destination: str
    status: Literal["ok", "missing", "skipped", "failed"]
    files: int


def _excluded(rel: str, patterns: list[str]) -> bool:
    name = PurePosixPath(rel).name
    return any(
        fnmatch.fnmatch(rel, p.rstrip("/")) or fnmatch.fnmatch(name, p.rstrip("/")) or rel.startswith(p)
        for p in patterns
    )


def _overlaps(a: str, b: str) -> bool:
    pa, pb = PurePosixPath(a), PurePosixPath(b)
    return pa == pb or pa in pb.parents or pb in pa.parents


async def collect_artifacts(
    sandbox: Sandbox, entries: list[ArtifactConfig], dest: Path, allowance: Allowance | None = None
) -> list[ArtifactRow]:
    """Copy every entry into `dest`; returns the manifest. Every entry is charged to one
    `allowance` (None: `TransferLimits()`'s artifact budget); `OutputBudgetExceeded` when
    they do not fit, the trial's outcome (never retried)."""
    allowance = allowance if allowance is not None else TransferLimits().artifacts()
    manifest: list[ArtifactRow] = []
    claimed: list[str] = []
    for entry in entries:
        rel = entry.relative_path
        row: ArtifactRow = {"source": entry.source, "destination": rel, "status": "ok", "files": 0}
        manifest.append(row)
        if any(_overlaps(rel, c) for c in claimed):
            row["status"] = "skipped"
            continue
        with tempfile.TemporaryDirectory(prefix="tf-artifact-") as tmp:
            try:
                got = await sandbox.download(entry.source, Path(tmp), allowance=allowance)
            except (SandboxPathNotFound, FileNotFoundError):
                row["status"] = "missing"
                continue
            if not got.exists() and not got.is_symlink():
                row["status"] = "failed"  # refused by the download (a link out of the tree)
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if got.is_dir():
                for f in sorted(p for p in got.rglob("*") if p.is_file()):
                    inner = f.relative_to(got).as_posix()
                    if _excluded(inner, entry.exclude):
                        continue
                    (target / inner).parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(f, target / inner)
                    row["files"] += 1
            else:
                shutil.move(got, target)
                row["files"] = 1
        claimed.append(rel)
    return manifest


def sanitized_copy(source: Path, dest_dir: Path) -> list[str]:
    """Copy `source` (a file or a directory) to `dest_dir/<its name>` through a tar archive
    extracted with the `data` filter, member by member: one refused member (a link out of
    the artifact, a device) is skipped, not fatal. Returns why members were refused."""
    refused: list[str] = []
    is_dir = source.is_dir() and not source.is_symlink()
    target = dest_dir / source.name if is_dir else dest_dir
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(source, arcname="." if is_dir else source.name)
        buf.seek(0)
        with tarfile.open(fileobj=buf) as tar:
            for member in tar:
                try:
                    tar.extract(member, target, filter="data")
                except tarfile.FilterError as e:
                    refused.append(f"{member.name}: {e}")
    return refused


async def upload_artifacts(
    sandbox: Sandbox, entries: list[ArtifactConfig], manifest: list[ArtifactRow], root: Path
) -> None:
    """Put the artifacts `collect_artifacts` copied into `root` into `sandbox` (a separate
    verifier) at their source paths (module docstring). Entries not collected ("missing",
    "skipped") are left out, as Harbor leaves out what does not exist on the host."""
    rows = {row["source"]: row for row in manifest}
    with tempfile.TemporaryDirectory(prefix="tf-artifacts-up-") as tmp:
        for index, entry in enumerate(entries):
            row = rows.get(entry.source)
            local = root / entry.relative_path
            if row is None or row["status"] != "ok" or not (local.exists() or local.is_symlink()):
                continue
            staged = Path(tmp) / str(index)
            # Off the event loop: the worker's proxy serves other trials' turns on it.
            refused = await asyncio.to_thread(sanitized_copy, local, staged)
            if refused:
                log.warning(
                    "artifact %s: %d unsafe entries skipped, e.g. %s", entry.source, len(refused), refused[0]
                )
            copy = staged / local.name
            target = entry.source.rstrip("/") or "/"
            if copy.is_dir() and not copy.is_symlink():
                # As Harbor's empty_dirs: the directory's old content goes, its root stays.
                q = shlex.quote(target)
                await _root_sh(
                    sandbox,
                    f"if [ -L {q} ] || {{ [ -e {q} ] && [ ! -d {q} ]; }}; then rm -rf {q}; fi; "
                    f"mkdir -p {q} && find {q} -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} + && chmod 777 {q}",
                )
                await sandbox.upload(copy, target)
            elif copy.is_file() and not copy.is_symlink():
                parent = PurePosixPath(target).parent.as_posix()
                await _root_sh(sandbox, f"mkdir -p {shlex.quote(parent)} && chmod 777 {shlex.quote(parent)}")
                named = Path(tmp) / f"{index}-file" / PurePosixPath(target).name
                named.parent.mkdir()
                await asyncio.to_thread(shutil.move, copy, named)
                await sandbox.upload(named, parent)


async def _root_sh(sandbox: Sandbox, script: str) -> None:
    """A shell command as root in a sandbox no agent ever ran in; failing is an
    infrastructure error (the verifier image lacks a shell or coreutils)."""
    res = await sandbox.exec(["sh", "-c", script], user="0", timeout_s=60)
    if not res.ok:
        raise SandboxLost(
            f"preparing artifact paths in the verifier sandbox failed: {res.stderr.strip()[-300:]}"
        )
