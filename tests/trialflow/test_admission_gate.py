"""trialflow.admission's gates: a limit that changes while held, waiters served in order,
cancellation that never leaks a unit, releases from other threads (Temporal's core calls a
slot supplier's release from its own), and the model-phase wait that is admitted over the
limit when its time runs out instead of failing the attempt."""

from __future__ import annotations

import asyncio
import threading

from trialflow.admission import Admission, Gate
from trialflow.metrics import TrialMetrics


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_acquire_waits_at_the_limit_and_resumes_in_order():
    gate = Gate(2)
    await gate.acquire()
    await gate.acquire()
    order: list[int] = []

    async def take(i: int) -> None:
        await gate.acquire()
        order.append(i)

    waiters = [asyncio.create_task(take(i)) for i in range(3)]
    await _settle()
    assert (gate.held, gate.waiting, order) == (2, 3, [])
    gate.release()
    await _settle()
    assert order == [0]
    gate.release()
    gate.release()
    await _settle()
    assert order == [0, 1, 2] and gate.held == 2  # each release went to the next waiter
    await asyncio.gather(*waiters)


async def test_lowering_the_limit_takes_nothing_back_raising_it_admits_waiters():
    gate = Gate(3)
    for _ in range(3):
        await gate.acquire()
    gate.set_limit(1)
    assert gate.held == 3  # never cancels a holder
    late = asyncio.create_task(gate.acquire())
    gate.release()
    gate.release()
    await _settle()
    assert not late.done() and gate.held == 1  # still at the new limit
    gate.set_limit(2)
    await _settle()
    assert late.done() and gate.held == 2
    gate.set_limit(0)
    assert gate.limit == 1  # a gate that admits nothing could never see a side recover


async def test_a_cancelled_waiter_leaks_no_unit_even_when_granted_first():
    gate = Gate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await _settle()
    gate.release()  # granted to the waiter (counted on its behalf) ...
    waiter.cancel()  # ... which is cancelled before it resumed
    await asyncio.gather(waiter, return_exceptions=True)
    assert gate.held == 0
    assert gate.try_acquire()


async def test_try_acquire_never_jumps_the_queue():
    gate = Gate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await _settle()
    gate.release()
    assert not gate.try_acquire()  # the unit went to the waiter
    await waiter
    assert gate.held == 1


async def test_release_from_another_thread_wakes_the_loop():
    gate = Gate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await _settle()
    thread = threading.Thread(target=gate.release)
    thread.start()
    thread.join()
    await asyncio.wait_for(waiter, 5)
    assert gate.held == 1


async def test_force_acquire_counts_over_the_limit():
    gate = Gate(1)
    await gate.acquire()
    gate.force_acquire()
    assert gate.held == 2 and not gate.try_acquire()
    gate.release()
    assert not gate.try_acquire()
    gate.release()
    assert gate.try_acquire()


async def test_leases_hold_the_sandbox_gate_until_they_end():
    metrics = TrialMetrics()
    admission = Admission(2, metrics)
    assert admission.sandboxes.try_acquire()  # a set-up's slot
    admission.lease("sb-1")  # its sandbox, before the slot goes back
    admission.lease("sb-1")  # idempotent
    admission.sandboxes.release()  # the set-up's slot goes back
    assert (admission.sandboxes.held, admission.live) == (1, 1)
    assert metrics.value("trialflow_admission_live_sandboxes") == 1
    admission.end_lease("sb-unknown")
    admission.end_lease("sb-1")
    admission.end_lease("sb-1")
    assert (admission.sandboxes.held, admission.live) == (0, 0)


async def test_model_phase_is_admitted_over_the_limit_when_its_wait_runs_out():
    metrics = TrialMetrics()
    admission = Admission(4, metrics)
    admission.set_limits(4, 1)
    async with admission.model_phase(10) as waited:
        assert waited < 1
        async with admission.model_phase(0.05) as waited_late:
            assert waited_late >= 0.05
            assert admission.model.held == 2
    assert admission.model.held == 0
    assert metrics.value("trialflow_admission_overadmitted_total") == 1
    assert metrics.value("trialflow_admission_limit", {"kind": "model_phase"}) == 1


async def test_model_phase_waiter_enters_when_a_holder_leaves():
    admission = Admission(4)
    admission.set_limits(4, 1)
    entered = asyncio.Event()
    leave = asyncio.Event()

    async def holder() -> None:
        async with admission.model_phase(10):
            await leave.wait()

    async def second() -> None:
        async with admission.model_phase(10):
            entered.set()

    first = asyncio.create_task(holder())
    await _settle()
    other = asyncio.create_task(second())
    await _settle()
    assert not entered.is_set() and admission.model.waiting == 1
    leave.set()
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.gather(first, other)
