"""trialflow.admission's controller, pure: slow start, growth only with demand and headroom,
soft and hard trims with a cooldown, the taper towards the KV target, the two sides
coupled (KV-bound work keeps sandboxes at the model limit plus a pipeline), and, as
properties over any run of signals, limits always within [floor, ceiling] with the model
limit under the sandbox limit, no growth while a signal is past a mark, and a closed loop
against a simulated replica (alone and shared by several workers) that settles below the
hard mark near the target, in about equal shares."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._hypothesis import examples
from trialflow.admission import (
    Mark,
    Policy,
    ReplicaSignals,
    SandboxSignals,
    Signals,
    State,
    Usage,
    step,
)

POLICY = Policy(ceiling=64, floor=1, start=4)
CLEAR = Signals(SandboxSignals(start_latency_s=1.0, start_baseline_s=1.0, cpu_pressure=10.0))


def replicas(kv: float, waiting: float = 0, preemptions: float = 0, n: int = 1) -> ReplicaSignals:
    return ReplicaSignals(
        replicas=n, kv_usage_mean=kv, kv_usage_max=kv, waiting=waiting, preemptions=preemptions
    )


def full(state: State, model: int = 0, model_waiting: int = 0) -> Usage:
    """The sandbox gate full of real work."""
    return Usage(
        sandboxes=state.sandbox_limit, sandbox_waiting=True, model=model, model_waiting=model_waiting
    )


def test_slow_start_doubles_to_the_ceiling_while_everything_is_clear():
    state = State.initial(POLICY)
    limits = []
    for _ in range(6):
        state = step(POLICY, state, CLEAR, full(state))
        limits.append(state.sandbox_limit)
    assert limits == [8, 16, 32, 64, 64, 64]
    assert str(state.binding) == "ceiling:max_concurrent_trials"


def test_no_growth_without_demand_and_the_limit_stays_near_its_use():
    state = replace(State.initial(POLICY), sandbox_limit=40)
    state = replace(state, sandbox_side=replace(state.sandbox_side, limit=40))
    state = step(POLICY, state, CLEAR, Usage(sandboxes=3))
    assert state.sandbox_limit == 6  # 2 x in use: a burst cannot overshoot by much
    assert str(state.binding) == "demand:idle"
    again = step(POLICY, state, CLEAR, Usage(sandboxes=0))
    assert again.sandbox_limit == POLICY.start


def test_hard_mark_cuts_to_a_share_of_use_then_cools_down():
    state = State.initial(POLICY)
    for _ in range(3):
        state = step(POLICY, state, CLEAR, full(state))
    assert state.sandbox_limit == 32
    slow = Signals(SandboxSignals(start_latency_s=7.0, start_baseline_s=1.0))
    state = step(POLICY, state, slow, full(state))
    assert state.sandbox_limit == 19  # floor(32 x 0.6)
    assert str(state.binding) == "sandbox:start_latency"
    held = [step(POLICY, state, CLEAR, full(state)).sandbox_limit]
    state = step(POLICY, state, CLEAR, full(state))
    state = step(POLICY, state, CLEAR, full(state))
    held.append(state.sandbox_limit)
    assert held == [19, 19]  # cooldown: the signal lags the admissions that caused it
    state = step(POLICY, state, CLEAR, full(state))
    state = step(POLICY, state, CLEAR, full(state))
    assert state.sandbox_limit > 19  # then growth again, additive now (no more slow start)
    assert state.sandbox_limit <= 19 + round(19 * POLICY.grow_fraction) * 2


def test_soft_mark_trims_below_use_without_cancelling_anyone():
    state = State.initial(replace(POLICY, start=20))
    memory = Signals(SandboxSignals(memory_pressure=15.0))
    state = step(replace(POLICY, start=20), state, memory, Usage(sandboxes=20, sandbox_waiting=True))
    assert state.sandbox_limit == 18  # 20 - ceil(20 x 0.1)
    assert str(state.binding) == "sandbox:memory_pressure"


def test_cpu_pressure_only_stops_growth():
    policy = replace(POLICY, start=20)
    state = State.initial(policy)
    for cpu in (96.0, 99.5):  # past the soft mark, then the hard one
        state = step(policy, state, Signals(SandboxSignals(cpu_pressure=cpu)), full(state))
        assert state.sandbox_limit == 20 and str(state.binding) == "sandbox:cpu_pressure"


def test_growth_tapers_as_kv_usage_nears_its_target():
    policy = replace(POLICY, start=32, ceiling=256)
    base = State.initial(policy)
    base = replace(base, replica_side=replace(base.replica_side, slow_start=False))

    def grown(kv: float) -> int:
        signals = Signals(CLEAR.sandbox, replicas(kv))
        usage = Usage(sandboxes=32, sandbox_waiting=True, model=32, model_waiting=4)
        return step(policy, base, signals, usage).replica_side.limit - 32

    steps = [grown(kv) for kv in (0.1, 0.4, 0.7, 0.79)]
    assert steps == sorted(steps, reverse=True) and steps[0] > steps[-1] >= 1


def test_kv_bound_work_binds_both_limits_on_the_replica_side():
    state = State.initial(POLICY)
    signals = Signals(CLEAR.sandbox, replicas(0.85))
    state = step(POLICY, state, signals, full(state, model=4, model_waiting=2))
    assert state.model_limit == 3  # soft trim: below its use, no new model phase
    assert state.sandbox_limit == 3 + 2  # the model limit plus a pipeline of at least 2
    assert str(state.binding) == "replica:kv_cache_usage"


def test_preemptions_are_a_hard_trim_of_the_model_phase():
    policy = replace(POLICY, start=20)
    state = State.initial(policy)
    signals = Signals(CLEAR.sandbox, replicas(0.5, preemptions=3))
    state = step(policy, state, signals, full(state, model=20))
    assert state.model_limit == 12 and str(state.binding) == "replica:preemptions"


def test_waiting_requests_count_per_replica():
    state = State.initial(POLICY)
    usage = full(state, model=4, model_waiting=1)
    two = step(POLICY, state, Signals(CLEAR.sandbox, replicas(0.2, waiting=6, n=2)), usage)
    one = step(POLICY, state, Signals(CLEAR.sandbox, replicas(0.2, waiting=6, n=1)), usage)
    assert two.model_limit > one.model_limit  # 3 per replica is clear; 6 on one is past the soft 4
    assert str(one.binding) == "replica:requests_waiting"


def test_without_model_phases_the_replica_side_never_binds():
    state = State.initial(POLICY)
    loaded = Signals(CLEAR.sandbox, replicas(0.99, preemptions=5))
    for _ in range(4):
        state = step(POLICY, state, loaded, full(state))  # oracle trials: no model phase
    assert state.sandbox_limit == 64


def test_a_policy_refuses_nonsense():
    import pytest

    with pytest.raises(ValueError):
        Mark(0.9, 0.5)
    with pytest.raises(ValueError):
        Policy(ceiling=4, floor=5)


# -- properties -----------------------------------------------------------------------------

maybe = st.one_of(st.none(), st.floats(0, 200, allow_nan=False))
sandbox_signals = st.builds(
    SandboxSignals,
    start_latency_s=maybe,
    start_baseline_s=st.one_of(st.none(), st.floats(0.01, 10)),
    start_failure_rate=st.one_of(st.none(), st.floats(0, 1)),
    cpu_pressure=maybe,
    memory_pressure=maybe,
    engine_latency_s=maybe,
)
replica_signals = st.one_of(
    st.none(),
    st.builds(
        ReplicaSignals,
        replicas=st.integers(1, 8),
        kv_usage_mean=st.floats(0, 1),
        kv_usage_max=st.floats(0, 1),
        waiting=st.floats(0, 100),
        preemptions=st.sampled_from([0.0, 0.0, 1.0]),
    ),
)
usages = st.builds(
    Usage,
    sandboxes=st.integers(0, 300),
    sandbox_waiting=st.booleans(),
    model=st.integers(0, 300),
    model_waiting=st.integers(0, 50),
)
policies = st.builds(Policy, ceiling=st.integers(1, 512), floor=st.just(1), start=st.integers(1, 64))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies, st.lists(st.tuples(sandbox_signals, replica_signals, usages), min_size=1, max_size=40))
def test_limits_always_within_bounds(policy, run):
    state = State.initial(policy)
    for sandbox, replica, usage in run:
        state = step(policy, state, Signals(sandbox, replica), usage)
        assert policy.floor <= state.model_limit <= state.sandbox_limit <= policy.ceiling


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies, st.lists(st.tuples(sandbox_signals, usages), min_size=1, max_size=40))
def test_never_grows_while_a_sandbox_signal_is_past_its_soft_mark(policy, run):
    from trialflow.admission._control import Pressure, sandbox_readings

    state = State.initial(policy)
    for sandbox, usage in run:
        before = state.sandbox_side.limit
        state = step(policy, state, Signals(sandbox), usage)
        if any(r.pressure >= Pressure.NEAR for r in sandbox_readings(policy, sandbox)):
            assert state.sandbox_side.limit <= before


def _closed_loop(workers: int, capacity: int, ticks: int = 200) -> tuple[list[float], list[int]]:
    """`workers` controllers share one replica whose KV usage is the model phases of all of
    them over `capacity`; each worker has endless trials. Returns (usage per tick, last
    model limits)."""
    policy = Policy(ceiling=512, start=4)
    states = [State.initial(policy) for _ in range(workers)]
    used = [0] * workers
    kv_trace = []
    for _ in range(ticks):
        total = sum(used)
        kv = min(1.0, total / capacity)
        preemptions = float(max(0, total - capacity))  # past the cache: evictions
        kv_trace.append(kv)
        signals = Signals(CLEAR.sandbox, replicas(kv, preemptions=preemptions))
        for i in range(workers):
            usage = Usage(
                sandboxes=states[i].sandbox_limit, sandbox_waiting=True, model=used[i], model_waiting=5
            )
            states[i] = step(policy, states[i], signals, usage)
            # trials finish and new ones enter up to the limit (admission never cancels:
            # above the limit the excess only drains as trials end, a quarter per tick)
            limit = states[i].model_limit
            used[i] = limit if used[i] <= limit else used[i] - max(1, (used[i] - limit + 3) // 4)
    return kv_trace, [s.model_limit for s in states]


def test_closed_loop_settles_near_the_kv_target_below_the_hard_mark():
    kv, _ = _closed_loop(workers=1, capacity=200)
    settled = kv[100:]
    assert max(settled) < POLICY.kv_usage.hard
    assert sum(settled) / len(settled) > 0.6  # close to the 0.8 target, not timid


def test_closed_loop_with_shared_replicas_keeps_them_below_the_hard_mark_in_fair_shares():
    kv, limits = _closed_loop(workers=4, capacity=400)
    settled = kv[100:]
    assert max(settled) < POLICY.kv_usage.hard
    assert sum(settled) / len(settled) > 0.55
    assert max(limits) - min(limits) <= max(3, max(limits) // 3)  # each about a quarter


def test_clear_replicas_hold_no_sandbox_back():
    """Sandbox-bound work with short model phases: the replica side's small limit (it saw
    little model demand) must not cap the sandboxes while the replicas are below every mark."""
    state = State.initial(POLICY)
    signals = Signals(CLEAR.sandbox, replicas(0.1))
    for _ in range(4):
        state = step(POLICY, state, signals, full(state, model=1))
    assert state.sandbox_limit == 64 and state.model_limit <= state.sandbox_limit
