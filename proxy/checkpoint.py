"""Where per-turn trajectory checkpoints go.

``CheckpointSink.write(session_id, seq, payload)`` receives the npz bytes of the part of a
trajectory added since the previous successful write (``Trajectory.delta_since``);
``seq`` counts successful writes from 0 per session, so a reader rebuilds the trajectory
by applying payloads in ``seq`` order. A sink that raises is retried by the session on the
next turn with a larger delta (nothing is skipped). The S3 sink lives in
``trialflow.storage``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class CheckpointSink(Protocol):
    async def write(self, session_id: str, seq: int, payload: bytes) -> None: ...


class MemorySink:
    """Keeps every payload in memory: ``payloads[session_id]`` lists them in seq order."""

    def __init__(self) -> None:
        self.payloads: dict[str, list[bytes]] = {}

    async def write(self, session_id: str, seq: int, payload: bytes) -> None:
        got = self.payloads.setdefault(session_id, [])
        if seq != len(got):
            raise ValueError(f"checkpoint seq {seq} for {session_id} out of order (have {len(got)})")
        got.append(payload)


class DirectorySink:
    """Writes ``{root}/{session_id}/{seq:06d}.npz`` atomically (temp file + rename), so a
    crash never leaves a half-written checkpoint under its final name."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, session_id: str, seq: int) -> Path:
        return self.root / session_id / f"{seq:06d}.npz"

    async def write(self, session_id: str, seq: int, payload: bytes) -> None:
        await asyncio.to_thread(self._write, self.path(session_id, seq), payload)

    @staticmethod
    def _write(path: Path, payload: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)

    def read_all(self, session_id: str) -> list[bytes]:
        """Payloads of ``session_id`` in seq order (for rebuilding after a crash)."""
        return [p.read_bytes() for p in sorted((self.root / session_id).glob("*.npz"))]
