"""trialflow.admission's runtime: the controller's decisions applied to the gates, shown in the
metrics and in the report, a log line when the binding side changes; and the sensors: PSI
text (this host's own /proc/pressure where it has one), the load-average fallback, a Docker
engine that does not answer, replica loads turned into new preemptions."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.replica_load import ReplicaLoad
from trialflow.admission import (
    Admission,
    Policy,
    ReplicaSignals,
    SandboxSignals,
    Sensors,
    Signals,
    StartStats,
)
from trialflow.admission._signals import ReplicaReadings, cpu_pressure, engine_latency_s, psi_some_avg10
from trialflow.metrics import TrialMetrics

PSI = "some avg10=12.50 avg60=3.00 avg300=1.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_psi_text_and_this_hosts_own_pressure_files():
    assert psi_some_avg10(PSI) == 12.5
    assert psi_some_avg10("full avg10=3.0\n") is None
    assert psi_some_avg10("some avg10=junk\n") is None
    real = Path("/proc/pressure/cpu")
    if real.exists():
        value = psi_some_avg10(real.read_text())
        assert value is not None and 0 <= value <= 100


def test_without_psi_cpu_pressure_is_the_load_per_core(tmp_path):
    value = cpu_pressure(tmp_path)  # an empty directory: no PSI files
    assert value is not None and 0 <= value <= 100


async def test_an_engine_that_does_not_answer_reads_as_unknown():
    class Down:
        def ping(self) -> object:
            raise ConnectionError("no engine")

    class Up:
        def ping(self) -> object:
            return True

    assert await engine_latency_s(Down()) is None
    assert await engine_latency_s(None) is None
    latency = await engine_latency_s(Up())
    assert latency is not None and latency >= 0


def test_start_stats_median_and_best_median():
    stats = StartStats(window=4, min_samples=3)
    stats.observe(1.0)
    stats.observe(2.0)
    assert stats.latency_s() is None  # too few to say
    stats.observe(3.0)
    assert stats.latency_s() == 2.0 and stats.baseline_s == 2.0
    for s in (8.0, 9.0, 10.0):
        stats.observe(s)
    assert stats.latency_s() == 8.5 and stats.baseline_s == 2.0  # the best median stays
    stats.observe(1.0, failed=True)
    assert stats.failure_rate() == 0.25


def test_replica_readings_count_new_preemptions_and_survive_a_restart():
    readings = ReplicaReadings()
    a, b = "http://a:1", "http://b:1"
    first = readings.signals({a: ReplicaLoad(0.2, 1, 3, 10), b: ReplicaLoad(0.6, 2, 3, 0)})
    assert first == ReplicaSignals(2, pytest.approx(0.4), 0.6, 3, 0)
    later = readings.signals({a: ReplicaLoad(0.3, 0, 3, 12), b: ReplicaLoad(0.6, 0, 3, 1)})
    assert later is not None and later.preemptions == 3
    restarted = readings.signals({a: ReplicaLoad(0.0, 0, 0, 0), b: ReplicaLoad(0.6, 0, 3, 1)})
    assert restarted is not None and restarted.preemptions == 0  # a counter reset is no preemption
    assert readings.signals({}) is None


def test_tick_applies_limits_and_shows_them(caplog):
    metrics = TrialMetrics()
    admission = Admission(16, metrics, Policy(ceiling=16, start=2))
    assert (admission.sandboxes.limit, admission.model.limit) == (2, 2)
    # the gate full of real work: two leases
    admission.lease("a")
    admission.lease("b")
    clear = Signals(SandboxSignals(cpu_pressure=5.0))
    with caplog.at_level(logging.INFO, logger="trialflow.admission"):
        state = admission.tick(clear)
    assert state is not None and admission.sandboxes.limit == 4
    assert metrics.value("trialflow_admission_limit", {"kind": "sandboxes"}) == 4
    assert metrics.value("trialflow_admission_binding", {"side": "sandbox", "signal": "slow_start"}) == 1
    assert metrics.value("trialflow_admission_signal", {"name": "sandbox_cpu_pressure"}) == 5.0
    # KV-bound: trials in their model phase and waiting for one, replicas near their target
    admission.model.force_acquire()
    admission.model.force_acquire()
    kv = Signals(SandboxSignals(cpu_pressure=5.0), ReplicaSignals(1, 0.9, 0.9, 0, 0))
    with caplog.at_level(logging.INFO, logger="trialflow.admission"):
        admission.tick(kv)
    assert "replica:kv_cache_usage binds now (was sandbox:slow_start)" in caplog.text
    assert metrics.value("trialflow_admission_binding", {"side": "sandbox", "signal": "slow_start"}) is None
    assert metrics.value("trialflow_admission_binding", {"side": "replica", "signal": "kv_cache_usage"}) == 1
    report = admission.report("w1")
    assert (report.mode, report.binding, report.live_sandboxes) == ("adaptive", "replica:kv_cache_usage", 2)
    assert report.signals["replica_kv_usage_mean"] == 0.9


def test_the_fixed_mode_never_moves_the_limits():
    admission = Admission(8)
    assert admission.tick(Signals(SandboxSignals(cpu_pressure=99.0))) is None
    assert (admission.sandboxes.limit, admission.model.limit) == (8, 8)
    assert admission.report("w").binding == "ceiling:max_concurrent_trials"


def test_a_policy_must_share_the_ceiling():
    with pytest.raises(ValueError):
        Admission(8, policy=Policy(ceiling=4))


async def test_sensors_read_every_signal(tmp_path):
    (tmp_path / "cpu").write_text(PSI)
    (tmp_path / "memory").write_text(PSI.replace("12.50", "1.00"))
    loads = {"http://r:1": ReplicaLoad(0.5, 2, 1, 0)}
    sensors = Sensors(StartStats(), None, lambda: loads, psi_dir=tmp_path)
    signals = await sensors.read()
    assert (signals.sandbox.cpu_pressure, signals.sandbox.memory_pressure) == (12.5, 1.0)
    assert signals.sandbox.engine_latency_s is None
    assert signals.replica == ReplicaSignals(1, 0.5, 0.5, 2, 0)
