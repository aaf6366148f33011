"""Prometheus metrics of a worker process, and the HTTP endpoint that serves them.

Metrics live in a `TrialMetrics` object with its own `CollectorRegistry` (not the global
one), so tests and several workers in one process never collide. Activities receive it
like any other client.

- ``trialflow_trials_running``            gauge: sandboxes alive on this worker (set-up..teardown)
- ``trialflow_trials_completed_total``    counter by termination reason (results stored here)
- ``trialflow_trials_failed_total``       counter by error type (results that carry an error)
- ``trialflow_phase_seconds``             histogram by phase (setup, scaffold, verify, teardown)
- ``trialflow_proxy_turn_seconds``        histogram of per-turn generation latency through the proxy

Admission (trialflow.admission, docs/admission.md), ``kind`` "sandboxes" or "model_phase":

- ``trialflow_admission_limit``           gauge: the working limit (the ceiling, or the controller's)
- ``trialflow_admission_held``            gauge: units held (sandboxes: set-up slots + live sandboxes)
- ``trialflow_admission_waiting``         gauge: acquirers waiting at the gate now
- ``trialflow_admission_live_sandboxes``  gauge: sandboxes holding a lease on this worker
- ``trialflow_admission_wait_seconds``    histogram by kind: how long admission made a trial wait
- ``trialflow_admission_binding``         gauge, 1 for the current ``side`` ("ceiling", "sandbox",
  "replica", "demand") and ``signal`` (e.g. "kv_cache_usage", "start_latency", "idle")
- ``trialflow_admission_signal``          gauge by ``name``: the last value of each signal read
  (``sandbox_cpu_pressure``, ``replica_kv_usage_mean``, ...)
- ``trialflow_admission_overadmitted_total``  counter: model phases admitted over the limit
  (their wait ran out: a limit must cost throughput, never an attempt)
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

_PHASE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class TrialMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.trials_running = Gauge(
            "trialflow_trials_running",
            "Sandboxes alive on this worker",
            registry=self.registry,
        )
        self.trials_completed = Counter(
            "trialflow_trials_completed",
            "Trials finished, by termination reason",
            ["termination"],
            registry=self.registry,
        )
        self.trials_failed = Counter(
            "trialflow_trials_failed",
            "Trials that ended with an error, by error type",
            ["error_type"],
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "trialflow_phase_seconds",
            "Duration of trial phases",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
        )
        self.proxy_turn_seconds = Histogram(
            "trialflow_proxy_turn_seconds",
            "Generation latency of one turn through the proxy",
            buckets=_TURN_BUCKETS,
            registry=self.registry,
        )

        self.admission_limit = Gauge(
            "trialflow_admission_limit", "Working admission limit", ["kind"], registry=self.registry
        )
        self.admission_held = Gauge(
            "trialflow_admission_held", "Admission units held", ["kind"], registry=self.registry
        )
        self.admission_waiting = Gauge(
            "trialflow_admission_waiting",
            "Acquirers waiting at an admission gate",
            ["kind"],
            registry=self.registry,
        )
        self.admission_live_sandboxes = Gauge(
            "trialflow_admission_live_sandboxes", "Sandboxes holding a lease", registry=self.registry
        )
        self.admission_wait_seconds = Histogram(
            "trialflow_admission_wait_seconds",
            "Time a trial waited at an admission gate",
            ["kind"],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
        )
        self.admission_binding = Gauge(
            "trialflow_admission_binding",
            "1 for the side and signal that bind the admission limits now",
            ["side", "signal"],
            registry=self.registry,
        )
        self.admission_signal = Gauge(
            "trialflow_admission_signal",
            "Last value of an admission signal",
            ["name"],
            registry=self.registry,
        )
        self.admission_overadmitted = Counter(
            "trialflow_admission_overadmitted",
            "Model phases admitted over the limit after their wait ran out",
            registry=self.registry,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` in a daemon thread. Port 0 disables it."""
        if port:
            start_http_server(port, addr=addr, registry=self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """Current sample value (for tests and the CLI); None if never observed."""
        return self.registry.get_sample_value(name, labels or {})
