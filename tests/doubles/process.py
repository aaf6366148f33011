"""The scripted vLLM double in its own process, so a test can SIGSTOP it (a hung replica:
its sockets accept, nothing answers, not even ``/health``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class DoubleProcess:
    url: str
    proc: asyncio.subprocess.Process

    def stop(self) -> None:
        """SIGSTOP: the process hangs (until ``resume``)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


@contextlib.asynccontextmanager
async def double_process(
    model_dir: Path, *, text: str = "OK", delay_s: float = 0.0
) -> AsyncIterator[DoubleProcess]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.doubles.scripted_vllm",
        "--model-dir",
        str(model_dir),
        "--text",
        text,
        "--delay-s",
        str(delay_s),
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        if not line.startswith("listening "):
            raise RuntimeError(f"the double did not start: {line!r}")
        yield DoubleProcess(line.split()[1], proc)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        await proc.wait()
