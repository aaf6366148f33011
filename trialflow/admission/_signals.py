"""The signals admission reads (the I/O around the pure controller, trialflow.admission._control).

- sandbox starts: the set-up activity reports each start's seconds and whether it failed
  for the host's reasons (`StartStats.observe`); the controller sees the median of the
  last `window` starts against the lowest such median seen (this host unloaded);
- host pressure: Linux PSI (``/proc/pressure/{cpu,memory}``, "some avg10": the share of the
  last 10 s in which some task waited); without PSI the CPU's is the 1-minute load per
  core beyond 1 (a load of twice the cores reads 100), memory's is unknown;
- Docker engine latency: one ``ping`` round trip (in a thread; the SDK is blocking);
- replicas: their loads as the shared replica pools last read them (proxy.pool:
  ``ReplicaPool.scrape_load``), the preemption counters turned into new preemptions since
  the previous reading.

Every reader answers None when it cannot tell (no PSI, no engine, no replica answered),
and the controller then judges on the rest.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from proxy.replica_load import ReplicaLoad
from trialflow.admission._control import ReplicaSignals, SandboxSignals, Signals

PSI_DIR = Path("/proc/pressure")


class StartStats:
    """Recent sandbox starts (seconds, failed) and the best median seen."""

    def __init__(self, window: int = 16, min_samples: int = 3) -> None:
        self._starts: deque[tuple[float, bool]] = deque(maxlen=window)
        self._min_samples = min_samples
        self.baseline_s: float | None = None

    def observe(self, seconds: float, failed: bool = False) -> None:
        self._starts.append((seconds, failed))

    def latency_s(self) -> float | None:
        ok = [s for s, failed in self._starts if not failed]
        if len(ok) < self._min_samples:
            return None
        median = statistics.median(ok)
        self.baseline_s = median if self.baseline_s is None else min(self.baseline_s, median)
        return median

    def failure_rate(self) -> float | None:
        if len(self._starts) < self._min_samples:
            return None
        return sum(failed for _, failed in self._starts) / len(self._starts)


def psi_some_avg10(text: str) -> float | None:
    """ "some avg10" of a /proc/pressure file's text; None if it has no such field."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for item in fields[1:]:
                key, _, value = item.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def read_pressure(resource: str, psi_dir: Path = PSI_DIR) -> float | None:
    try:
        return psi_some_avg10((psi_dir / resource).read_text())
    except OSError:
        return None


def cpu_pressure(psi_dir: Path = PSI_DIR) -> float | None:
    psi = read_pressure("cpu", psi_dir)
    if psi is not None:
        return psi
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        return None
    return min(100.0, max(0.0, load1 / (os.cpu_count() or 1) - 1.0) * 100.0)


class Pingable(Protocol):
    def ping(self) -> object: ...


async def engine_latency_s(client: Pingable | None) -> float | None:
    """One Docker engine round trip; None without an engine or when the ping fails."""
    if client is None:
        return None
    started = time.monotonic()
    try:
        await asyncio.to_thread(client.ping)
    except Exception:  # the engine being unreachable is the sandbox side's problem, not ours
        return None
    return time.monotonic() - started


class ReplicaReadings:
    """Replica loads -> `ReplicaSignals`, with new preemptions since the last reading."""

    def __init__(self) -> None:
        self._preemptions: dict[str, float] = {}

    def signals(self, loads: Mapping[str, ReplicaLoad]) -> ReplicaSignals | None:
        if not loads:
            return None
        new = 0.0
        for url, load in loads.items():
            before = self._preemptions.get(url)
            # a counter that went down is a restarted replica: its count starts again
            if before is not None and load.preemptions_total >= before:
                new += load.preemptions_total - before
            self._preemptions[url] = load.preemptions_total
        kv = [load.kv_usage for load in loads.values()]
        return ReplicaSignals(
            replicas=len(loads),
            kv_usage_mean=sum(kv) / len(kv),
            kv_usage_max=max(kv),
            waiting=sum(load.waiting for load in loads.values()),
            preemptions=new,
        )


class Sensors:
    """Reads every signal once per `read()`. `replica_loads`: the proxy's
    (``ProxyServer.replica_loads``), or None on a worker without a model."""

    def __init__(
        self,
        starts: StartStats,
        engine: Pingable | None = None,
        replica_loads: Callable[[], Mapping[str, ReplicaLoad]] | None = None,
        psi_dir: Path = PSI_DIR,
    ) -> None:
        self.starts = starts
        self._engine = engine
        self._replica_loads = replica_loads
        self._replicas = ReplicaReadings()
        self._psi_dir = psi_dir

    async def read(self) -> Signals:
        latency = self.starts.latency_s()
        sandbox = SandboxSignals(
            start_latency_s=latency,
            start_baseline_s=self.starts.baseline_s,
            start_failure_rate=self.starts.failure_rate(),
            cpu_pressure=cpu_pressure(self._psi_dir),
            memory_pressure=read_pressure("memory", self._psi_dir),
            engine_latency_s=await engine_latency_s(self._engine),
        )
        loads = self._replica_loads() if self._replica_loads is not None else {}
        return Signals(sandbox=sandbox, replica=self._replicas.signals(loads))
