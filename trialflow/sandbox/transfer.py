"""Budgets on files copied out of a sandbox, and the streamed tar extraction that keeps them.

Everything a sandbox gives back to the host (task artifacts, /logs/verifier, an agent's
stdout/stderr files) arrives as a tar stream from the engine's archive API. It is read and
extracted member by member (`extract_stream`), never held whole in memory or on disk, and
each member is charged to an `Allowance` *before* its data is read: bytes by the size its
tar header states (a sparse file counts by its apparent size, which is what a copy of it
costs), entries one each (files, directories, links: every one is an inode and a store
object). The member that would cross the allowance raises `OutputBudgetExceeded`; nothing
of it reaches the disk, and the caller closes the stream, so the engine stops sending.

Limits (`TransferLimits`, from `TrialflowSettings`): artifacts share one allowance per
verification (every entry of the task together); each log copy has its own. Extraction
keeps the rules of `Sandbox.download`: the top entry of a directory is stripped, and a
member the `data` filter refuses (a link out of the tree, a device) is skipped alone.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trialflow.errors import OutputBudgetExceeded

MiB = 1 << 20


@dataclass(frozen=True)
class TransferLimits:
    """Budgets per copy out of a sandbox. Defaults: artifacts 256 MiB and 10,000 entries
    per verification (Harbor sets none; real tasks' artifacts are logs and small outputs);
    logs 32 MiB and 1,000 entries per copy (a verifier's /logs/verifier, an agent's stdout
    or stderr file; the exec output the worker keeps is a separate tail cap)."""

    artifact_bytes: int = 256 * MiB
    artifact_files: int = 10_000
    log_bytes: int = 32 * MiB
    log_files: int = 1_000

    def artifacts(self) -> Allowance:
        return Allowance("artifacts", self.artifact_bytes, self.artifact_files)

    def logs(self, what: str = "logs") -> Allowance:
        return Allowance(what, self.log_bytes, self.log_files)


class Allowance:
    """What copies out of a sandbox may still bring: `max_bytes` of regular-file data (as
    the tar headers state it) and `max_files` entries. Shared by the copies charged to it."""

    def __init__(self, what: str, max_bytes: int, max_files: int) -> None:
        self.what, self.max_bytes, self.max_files = what, max_bytes, max_files
        self.used_bytes = self.used_files = 0

    def take(self, member: tarfile.TarInfo, size: int | None = None, where: str = "") -> None:
        """Charge one member (`size`: its data, by default a regular file's header size;
        `where`: the directory it came from, for the message); `OutputBudgetExceeded`
        (nothing charged) when it does not fit."""
        size = (member.size if member.isreg() else 0) if size is None else size
        name = f"{where.rstrip('/')}/{member.name}" if where else member.name
        if self.used_files + 1 > self.max_files:
            raise OutputBudgetExceeded(self.what, f"{self.max_files} entries", name)
        if self.used_bytes + size > self.max_bytes:
            raise OutputBudgetExceeded(
                self.what, f"{self.max_bytes} bytes ({size} more after {self.used_bytes})", name
            )
        self.used_files += 1
        self.used_bytes += size


class ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (an HTTP body), for tarfile's
    stream mode; holds at most one chunk."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._rest = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._rest:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._rest = memoryview(chunk)
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def extract_stream(
    chunks: Iterable[bytes], dest: Path, *, strip_top: bool, allowance: Allowance, where: str = ""
) -> None:
    """Extract the tar stream `chunks` into `dest` (module docstring). `strip_top`: the
    archive of a directory (its basename is the top entry; its contents land in `dest`).
    `where`: the sandbox path the archive is of, named in a budget error."""
    dest.mkdir(parents=True, exist_ok=True)
    # A hard link is another full copy once stored: charged its target's size.
    sizes: dict[str, int] = {}
    with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), 1 << 16), mode="r|") as tar:
        for member in tar:
            if strip_top:
                parts = member.name.split("/", 1)
                if len(parts) == 1:
                    continue  # the directory itself
                member.name = parts[1]
                if member.islnk():  # hard links name their target by archive path
                    member.linkname = member.linkname.split("/", 1)[-1]
            size = sizes.get(member.linkname, 0) if member.islnk() else None
            allowance.take(member, size, where if strip_top else str(Path(where).parent) if where else "")
            if member.isreg():
                sizes[member.name] = member.size
            # One refused member (a link out of the tree: the sandbox's files are the
            # agent's; a hard link to a member not extracted) is skipped; it must not cost
            # the rest of the copy.
            try:
                tar.extract(member, dest, filter="data")
            except (tarfile.FilterError, tarfile.StreamError):
                continue
