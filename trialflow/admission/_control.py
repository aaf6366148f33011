"""The admission controller: pure decisions, no I/O (the runtime feeds it, trialflow.admission._runtime).

Each tick it takes what the worker sees now (`Signals`: the sandbox side's start latency and
failures, host CPU and memory pressure, Docker engine latency; the replicas' KV-cache usage,
waiting requests and new preemptions) and what admission holds (`Usage`), and returns the
next `State`: how many trials may hold a sandbox (`sandbox_limit`) and how many may be in
their model phase (`model_limit`), both in ``[floor, ceiling]``, and which signal binds them.

Each side keeps a limit of its own and moves it by the worst of its signals, each judged
against a `Mark` (soft, hard):

- over a hard mark: hard trim, to ``hard_trim`` x what is in use, then `cooldown_ticks` ticks
  without growth (the signals lag the admissions that caused them);
- over a soft mark: soft trim, to at most what is in use and ``soft_trim_step`` below the limit
  (host CPU pressure past its mark only stops growth: `Reading.trims`);
- below every soft mark, with demand (the limit is full and work waits for it): grow. Slow
  start doubles the limit until a first signal comes within half of its soft mark; after
  that each step is ``grow_fraction`` x the limit, tapered by the smallest headroom left
  (a KV usage of 0.7 against a target of 0.8 grows by an eighth of a full step), at least 1;
- below every soft mark without demand: hold, but a limit never runs further than
  ``2 x in use`` (at least ``start``) ahead of what is used, so an idle spell does not leave
  a limit that a burst of trials would overshoot before any signal could answer.

The two sides meet: trials in their model phase hold sandboxes, so the model limit is at
most the sandbox side's, and while the replica side is near or past a mark (KV-bound work)
the sandbox limit is the model limit plus ``pipeline`` of it (at least 2): enough sandboxes
being set up and verified to start a model phase the moment one ends, no more idle
sandboxes than that. With replicas below every mark, their limit holds no sandbox back.
Without replicas (model-free scaffolds), or while no trial has a model phase, the replica
side does not bind. Never does a decision take a held unit back: admission backs off by
admitting no one, not by cancelling.

Replicas shared by many workers: every worker reads the same replicas' metrics, so all of
them see the same KV usage and trim together; each one's growth tapers towards the target
on its own, and a hard trim cuts each worker's use by the same factor, the additive-increase,
multiplicative-decrease rule under which workers sharing a resource converge on equal shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Literal


class Pressure(IntEnum):
    CLEAR = 0
    NEAR = 1  # over a soft mark
    OVER = 2  # over a hard mark


@dataclass(frozen=True)
class Mark:
    """A signal's soft and hard marks (soft <= hard, both > 0); higher values are worse."""

    soft: float
    hard: float

    def __post_init__(self) -> None:
        if not 0 < self.soft <= self.hard:
            raise ValueError(f"a mark needs 0 < soft <= hard, got soft={self.soft} hard={self.hard}")

    def pressure(self, value: float) -> Pressure:
        if value >= self.hard:
            return Pressure.OVER
        return Pressure.NEAR if value >= self.soft else Pressure.CLEAR

    def headroom(self, value: float) -> float:
        """How far below the soft mark, as a fraction of it: 1 at zero, 0 at the mark."""
        return min(1.0, max(0.0, 1.0 - value / self.soft))


@dataclass(frozen=True)
class SandboxSignals:
    """The host's side; None: not measured (yet). Start latency: the median of recent
    sandbox starts; baseline: the lowest such median seen on this host."""

    start_latency_s: float | None = None
    start_baseline_s: float | None = None
    start_failure_rate: float | None = None  # share of recent set-ups that failed, 0..1
    cpu_pressure: float | None = None  # % of time some task waited for a CPU (PSI some avg10)
    memory_pressure: float | None = None  # % of time some task stalled on memory (PSI)
    engine_latency_s: float | None = None  # one Docker engine round trip (ping)


@dataclass(frozen=True)
class ReplicaSignals:
    """The replicas' side, from their own metrics (every worker reads the same replicas)."""

    replicas: int  # replicas whose metrics answered
    kv_usage_mean: float  # 0..1
    kv_usage_max: float  # 0..1
    waiting: float  # requests waiting, all replicas together
    preemptions: float  # new preemptions since the last tick, all replicas together


@dataclass(frozen=True)
class Signals:
    sandbox: SandboxSignals = field(default_factory=SandboxSignals)
    replica: ReplicaSignals | None = None  # None: no replica answered (or none configured)


@dataclass(frozen=True)
class Usage:
    """What admission holds now. ``sandboxes``: set-ups running plus live sandboxes;
    ``sandbox_waiting``: whether work waits for the sandbox gate (it is full of real work)."""

    sandboxes: int = 0
    sandbox_waiting: bool = False
    model: int = 0  # trials in their model phase
    model_waiting: int = 0  # trials waiting for one


@dataclass(frozen=True)
class Policy:
    """The controller's settings (from `TrialflowSettings`, docs/admission.md). ``ceiling``:
    ``max_concurrent_trials``; ``start``: both limits' first value."""

    ceiling: int
    floor: int = 1
    start: int = 4
    kv_usage: Mark = Mark(0.80, 0.95)  # soft: the KV target (mean usage); hard: any replica
    waiting_per_replica: Mark = Mark(4.0, 16.0)
    start_slowdown: Mark = Mark(3.0, 6.0)  # start latency / its baseline
    start_failures: Mark = Mark(0.05, 0.25)
    cpu_pressure: Mark = Mark(95.0, 99.0)  # hold-only (Reading.trims)
    memory_pressure: Mark = Mark(10.0, 40.0)
    engine_latency_s: Mark = Mark(1.0, 5.0)
    grow_fraction: float = 0.25
    soft_trim_step: float = 0.1  # of the limit, at least 1
    hard_trim: float = 0.6
    cooldown_ticks: int = 3
    pipeline: float = 0.25

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"admission needs 1 <= floor <= ceiling, got {self.floor}, {self.ceiling}")
        if not 0 < self.hard_trim < 1 or not 0 < self.grow_fraction or not 0 < self.soft_trim_step < 1:
            raise ValueError("admission needs 0 < hard_trim < 1, grow_fraction > 0, 0 < soft_trim_step < 1")

    def clamp(self, n: int) -> int:
        return max(self.floor, min(self.ceiling, n))


# "demand": nothing binds; fewer trials want in than the limit allows
Side = Literal["ceiling", "sandbox", "replica", "demand"]


@dataclass(frozen=True)
class Binding:
    """What holds a limit where it is: the side, and its signal (a reading's name, or
    "max_concurrent_trials", "slow_start", "growing", "idle", "cooldown")."""

    side: Side
    signal: str

    def __str__(self) -> str:
        return f"{self.side}:{self.signal}"


@dataclass(frozen=True)
class SideState:
    limit: int
    cooldown: int = 0
    slow_start: bool = True
    signal: str = "slow_start"


@dataclass(frozen=True)
class State:
    sandbox_side: SideState
    replica_side: SideState
    sandbox_limit: int
    model_limit: int
    binding: Binding

    @classmethod
    def initial(cls, policy: Policy) -> State:
        start = policy.clamp(policy.start)
        side = SideState(limit=start)
        binding = (
            Binding("ceiling", "max_concurrent_trials")
            if start == policy.ceiling
            else Binding("sandbox", "slow_start")
        )
        return cls(side, side, start, start, binding)


@dataclass(frozen=True)
class Reading:
    """One signal judged against its mark. ``trims`` False: past its mark it only stops
    growth (host CPU pressure: a busy CPU is not by itself a slower trial; measured in
    docs/benchmarks.md, where trimming on it cost a third of the throughput)."""

    name: str
    pressure: Pressure
    headroom: float
    trims: bool = True


def sandbox_readings(policy: Policy, s: SandboxSignals) -> list[Reading]:
    out: list[Reading] = []

    def add(name: str, mark: Mark, value: float | None, trims: bool = True) -> None:
        if value is not None and math.isfinite(value):
            out.append(Reading(name, mark.pressure(value), mark.headroom(value), trims))

    if s.start_latency_s is not None and s.start_baseline_s:
        add("start_latency", policy.start_slowdown, s.start_latency_s / max(s.start_baseline_s, 0.05))
    add("start_failures", policy.start_failures, s.start_failure_rate)
    add("cpu_pressure", policy.cpu_pressure, s.cpu_pressure, trims=False)
    add("memory_pressure", policy.memory_pressure, s.memory_pressure)
    add("engine_latency", policy.engine_latency_s, s.engine_latency_s)
    return out


def replica_readings(policy: Policy, r: ReplicaSignals) -> list[Reading]:
    kv = policy.kv_usage
    # the mean against the target; any one replica at the hard mark is a hard trim
    kv_pressure = max(
        kv.pressure(r.kv_usage_mean), Pressure.OVER if r.kv_usage_max >= kv.hard else Pressure.CLEAR
    )
    waiting = r.waiting / max(1, r.replicas)
    out = [
        Reading("kv_cache_usage", kv_pressure, kv.headroom(r.kv_usage_mean)),
        Reading(
            "requests_waiting",
            policy.waiting_per_replica.pressure(waiting),
            policy.waiting_per_replica.headroom(waiting),
        ),
    ]
    if r.preemptions > 0:  # the KV cache already ran out: vLLM evicted running requests
        out.append(Reading("preemptions", Pressure.OVER, 0.0))
    return out


def step_side(
    policy: Policy, side: SideState, readings: list[Reading], in_use: int, demand: bool
) -> SideState:
    """One side's next limit (module docstring: hard trim, soft trim, grow, hold)."""
    worst = max((r for r in readings if r.trims), key=lambda r: (r.pressure, -r.headroom), default=None)
    blocking = next((r for r in readings if not r.trims and r.pressure >= Pressure.NEAR), None)
    cooldown = max(0, side.cooldown - 1)
    if worst is not None and worst.pressure is Pressure.OVER:
        limit = policy.clamp(math.floor(min(side.limit, in_use) * policy.hard_trim))
        return SideState(limit, policy.cooldown_ticks, False, worst.name)
    if worst is not None and worst.pressure is Pressure.NEAR:
        trim = max(1, math.ceil(side.limit * policy.soft_trim_step))
        limit = policy.clamp(min(side.limit - trim, in_use))
        return SideState(limit, cooldown, False, worst.name)
    taper = min((r.headroom for r in readings), default=1.0)
    slow = side.slow_start and taper > 0.5
    if not demand:
        ahead = max(policy.start, 2 * in_use)
        return SideState(policy.clamp(min(side.limit, ahead)), cooldown, slow, "idle")
    if cooldown > 0:
        return SideState(side.limit, cooldown, slow, "cooldown")
    if blocking is not None:  # past a hold-only mark: no growth, no trim
        return SideState(side.limit, 0, False, blocking.name)
    if slow:
        return SideState(policy.clamp(side.limit * 2), 0, True, "slow_start")
    grow = max(1, round(side.limit * policy.grow_fraction * taper))
    nearest = min(readings, key=lambda r: r.headroom).name if readings else "growing"
    return SideState(policy.clamp(side.limit + grow), 0, False, nearest)


def pipeline_room(policy: Policy, model_limit: int) -> int:
    """Sandboxes beyond the model limit, for trials setting up and verifying."""
    return max(2, math.ceil(model_limit * policy.pipeline))


def step(policy: Policy, state: State, signals: Signals, usage: Usage) -> State:
    """The next state (module docstring). Pure: same inputs, same answer."""
    models_used = usage.model + usage.model_waiting > 0
    replica_binds = signals.replica is not None and models_used
    # the sandbox side: demand only when its own limit is what holds trials back
    sandbox_demand = usage.sandbox_waiting and state.binding.side != "replica"
    sandbox_side = step_side(
        policy, state.sandbox_side, sandbox_readings(policy, signals.sandbox), usage.sandboxes, sandbox_demand
    )
    replica_side = state.replica_side
    pressed = False  # the replicas near or past a mark (or cooling down after a cut)
    if replica_binds:
        assert signals.replica is not None
        readings = replica_readings(policy, signals.replica)
        model_demand = usage.model_waiting > 0 and state.model_limit == replica_side.limit
        replica_side = step_side(policy, replica_side, readings, usage.model, model_demand)
        pressed = replica_side.cooldown > 0 or any(r.pressure >= Pressure.NEAR for r in readings)
    model_limit = min(replica_side.limit, sandbox_side.limit) if replica_binds else sandbox_side.limit
    sandbox_limit = sandbox_side.limit
    binding = Binding("demand" if sandbox_side.signal == "idle" else "sandbox", sandbox_side.signal)
    if pressed:  # only a saturating replica side holds sandboxes back (short model phases do not)
        coupled = policy.clamp(replica_side.limit + pipeline_room(policy, replica_side.limit))
        if coupled < sandbox_limit:
            side: Side = "demand" if replica_side.signal == "idle" else "replica"
            sandbox_limit, binding = coupled, Binding(side, replica_side.signal)
    if sandbox_limit >= policy.ceiling:
        binding = Binding("ceiling", "max_concurrent_trials")
    return replace(
        state,
        sandbox_side=sandbox_side,
        replica_side=replica_side,
        sandbox_limit=policy.clamp(sandbox_limit),
        model_limit=policy.clamp(min(model_limit, sandbox_limit)),
        binding=binding,
    )
