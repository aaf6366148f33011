"""One trialflow worker process: Temporal workers + in-process proxy + sandbox backend.

Three Temporal workers share one client:
- the shared queue (`settings.task_queue`, default `SHARED_QUEUE`): TrialWorkflow,
  result storage and the teardown fallback;
- its set-up queue (`setup_queue`): new sandboxes, on this process's engine (a drain
  stops this one first);
- this process's host queue (`host_queue(hostname, worker_id)`): scaffold, verify and
  teardown of the sandboxes this process created.

Fleet (docs/deploy.md): the worker writes through a `FencedStore` (a fenced attempt's late
writes are refused), holds a `HostLease` on its sandboxes (renewed every `host_lease_s / 3`;
lapsed or fenced sandboxes removed, re-registered before the next set-up), and at start
removes every sandbox its host queue left on the engine (a stable worker id: the same queue
after a restart, and a fresh process holds none).

Lifecycle: `async with WorkerProcess(settings, client) as worker:` connects (unless given a
client), starts the proxy, builds the workers and polls in the background; leaving the
block drains (`_drain`): no new sandboxes are taken, the trials whose sandboxes live here
run to their teardown, within `drain_grace_s` in all; then the workers stop (running
activities are cancelled after the grace) and the proxy and backend close. A worker that
dies inside the block ends `wait()` and is raised on exit. Used by `worker_main.py`, the CLI's
in-process worker and the tests.

It imports the activities and the workflow, so it belongs to the entry layer (with the CLI and
`worker_main.py`), not to the domain package it was once in as `trialflow.worker`
(tests/test_import_direction.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import resource
import signal
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from activities.sandbox import SandboxActivities
from activities.scaffold import ScaffoldActivities
from activities.steps import StepActivities
from activities.store import StoreActivities
from activities.verify import VerifyActivities
from trialflow.admission import Admission, Sensors, admission_key
from trialflow.cluster import advertised_host, check_fleet_store, connect_temporal
from trialflow.cluster import worker_id as cluster_worker_id
from trialflow.errors import StorageError
from trialflow.fencing import FencedStore, HostLease
from trialflow.metrics import TrialMetrics
from trialflow.policy_sync import join_weight_syncs, unregister_proxy
from trialflow.sandbox import SandboxBackend
from trialflow.sandbox.egress import Egresses, EgressLimits
from trialflow.sandbox.registry import open_backend
from trialflow.scaffolds import register_scaffold
from trialflow.settings import TrialflowSettings
from trialflow.storage import open_store
from workflows.shared import host_queue, setup_queue
from workflows.trial import TrialWorkflow

if TYPE_CHECKING:
    from proxy.pool import ReplicaPool
    from proxy.server import ProxyServer

log = logging.getLogger("trialflow.worker")

REAP_INTERVAL_S = 600.0
# The SDK sends an activity's heartbeats at most every 0.8 x its heartbeat timeout (24 s of a
# 30 s timeout), leaving a busy host 6 s of slack before the server calls it lost; this cap
# sends them every few seconds instead (activities beat every timeout/3 at most, 5 s).
HEARTBEAT_THROTTLE = timedelta(seconds=5)
STICKY_WAIT = timedelta(seconds=3)  # Temporal's default: 10 s
REPO_ROOT = Path(__file__).resolve().parents[2]


def open_proxy(settings: TrialflowSettings) -> ProxyServer | None:
    """The in-process proxy; None without a model dir (model-free scaffolds only). Harmony
    (gpt-oss) reads its vocabulary from `settings.harmony_vocab_dir`."""
    if settings.model_dir is None:
        return None
    from proxy.parsers import use_vocabulary
    from proxy.server import ProxyServer
    from proxy.session import SessionConfig

    use_vocabulary(settings.harmony_vocab_dir)  # before the server makes its parsers
    pools = replica_pools(settings)
    return ProxyServer(
        model_dir=settings.model_dir,
        host=settings.proxy_host,
        port=settings.proxy_port,
        pool=pools(settings.replica_urls),
        pool_factory=pools,
        defaults=SessionConfig(model=settings.model_name),
        profile=settings.model_profile,
        session_max_requests=settings.session_max_requests,
        session_max_queued_bytes=settings.session_max_queued_bytes,
        session_max_connections=connection_cap(settings),
    )


# A trial's sandboxes (the agent's, a separate verifier's) and the descriptors one slot of
# their listeners can hold: an egress tunnel's two plus a session connection.
_SANDBOXES_PER_TRIAL, _FDS_PER_SLOT = 2, 3


def connection_cap(settings: TrialflowSettings) -> int:
    """Connections each listener of a sandbox may hold: `sandbox_max_connections`, but no
    more than a fair share of half this process's file-descriptor limit (the other half
    is for Temporal, the engine, the store and the replicas) among the sandboxes of
    `max_concurrent_trials` trials, so that all of them flooding at once still leave the
    worker descriptors. The soft limit is raised to the hard one first (logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("file-descriptor limit raised from %d to %d", soft, hard)
            soft = hard
    share = soft // 2 // (settings.max_concurrent_trials * _SANDBOXES_PER_TRIAL * _FDS_PER_SLOT)
    return max(4, min(settings.sandbox_max_connections, share))


def replica_pools(settings: TrialflowSettings) -> Callable[[Sequence[str]], ReplicaPool]:
    """Makes the proxy's replica pools (the default one and each shared one) with the
    settings' outage hold."""
    from proxy.pool import ReplicaPool

    return functools.partial(ReplicaPool, outage_hold_s=settings.replica_outage_hold_s)


def build_id() -> str:
    """The workers' Temporal build id: a hash of this checkout's workflow and activity
    sources. Given explicitly because the SDK's default hashes the code of every loaded
    module, which trips over transformers' lazy modules (a warning line for each, ~200)."""
    digest = hashlib.sha256()
    for path in sorted([*REPO_ROOT.glob("workflows/*.py"), *REPO_ROOT.glob("activities/*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"trialflow-{digest.hexdigest()[:16]}"


class WorkerProcess:
    """Everything one worker process runs (see the module docstring for the lifecycle).

    The attributes below exist inside the `async with` block only."""

    client: Client
    proxy: ProxyServer | None
    backend: SandboxBackend
    metrics: TrialMetrics
    admission: Admission
    host_queue: str
    sandboxes: SandboxActivities
    workflows: Worker  # shared queue: workflows, result storage, teardown fallback
    setups: Worker  # the set-up queue: new sandboxes
    host: Worker  # this process's host queue
    lease: HostLease  # this host's registration and its lease on its sandboxes

    def __init__(
        self, settings: TrialflowSettings, client: Client | None = None, *, in_process: bool = False
    ) -> None:
        """`in_process`: the worker of a `run` command (its id, if not set, is the process's)."""
        self.settings = settings
        self._client = client
        self._in_process = in_process
        self._stop = asyncio.Event()
        self._running: asyncio.Task[None] | None = None
        self._reporting: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Self:
        await self._build()
        self._running = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._running is not None:
            await self._running  # drains; a worker's own error surfaces here

    async def wait(self, stop: asyncio.Event) -> None:
        """Return when `stop` is set or the workers stopped by themselves (one died)."""
        if self._running is None:
            raise RuntimeError("WorkerProcess.wait() outside its `async with` block")
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([stopped, self._running], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()

    async def _build(self) -> None:
        """Connect, start the proxy, create the activity objects and the three workers."""
        settings = self.settings
        self.client = self._client or await connect_temporal(settings)
        worker_id = cluster_worker_id(settings, in_process=self._in_process)
        self.host_queue = queue = host_queue(socket.gethostname(), worker_id)
        self.metrics = metrics = TrialMetrics()
        for name, target in settings.extra_scaffolds.items():
            register_scaffold(name, target)
        store = FencedStore(open_store(settings))
        limits = settings.transfer_limits()
        # the backend the settings name (trialflow.sandbox.registry), its sandboxes labelled
        # with this host queue so that its reaper removes only this process's leaks
        self.backend = open_backend(settings, labels={"trialflow.worker": queue})
        self.proxy = open_proxy(settings)
        self._store, self._worker_id = store, worker_id
        if self.proxy is not None:
            await self.proxy.start()
            await join_weight_syncs(store, self.proxy, worker_id, settings.advertise_host)
        # the sandboxes' egress proxies, shared by their activities
        self.egresses = egresses = Egresses(
            EgressLimits(
                max_connections=connection_cap(settings), idle_timeout_s=settings.egress_idle_timeout_s
            )
        )
        # live sandboxes and model phases of this host, below max_concurrent_trials
        self.admission = admission = Admission(
            settings.max_concurrent_trials, metrics, settings.admission_policy()
        )
        self._sensors = Sensors(
            admission.starts, self.backend, self.proxy.replica_loads if self.proxy is not None else None
        )
        self.lease = HostLease(
            store, worker_id, queue, settings.host_lease_s, address=advertised_host(settings)
        )
        self.sandboxes = sandbox = SandboxActivities(
            self.backend, store.uri, queue, metrics, egresses, admission, lease=self.lease
        )
        scaffold = ScaffoldActivities(
            self.proxy, self.backend, store, metrics, self.client, settings.model_name, egresses, admission
        )
        verify = VerifyActivities(self.backend, store, metrics, egresses, limits)
        steps = StepActivities(self.backend)
        results = StoreActivities(store, metrics)
        grace = timedelta(seconds=settings.drain_grace_s)
        version = build_id()
        n = settings.max_concurrent_trials
        # Few polls outstanding, and a short sticky wait: a host that stops answering takes
        # with it the tasks its polls already hold at the server (each costs a task timeout),
        # and its cached workflows' tasks wait on its sticky queue (docs/deploy.md, "Failover").
        self.workflows = Worker(
            self.client,
            task_queue=settings.task_queue,
            workflows=[TrialWorkflow],
            activities=[sandbox.teardown, results.store_result, results.fence_attempt],
            graceful_shutdown_timeout=grace,
            build_id=version,
            workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(2),
            activity_task_poller_behavior=PollerBehaviorSimpleMaximum(2),
            sticky_queue_schedule_to_start_timeout=STICKY_WAIT,
        )
        # A set-up is polled only with room for its sandbox (admission's sandbox gate: set-ups
        # in flight + live sandboxes <= its limit <= n); beyond, trials queue in Temporal.
        self.setups = Worker(
            self.client,
            task_queue=setup_queue(settings.task_queue),
            activities=[sandbox.setup],
            tuner=admission.tuner(),
            graceful_shutdown_timeout=grace,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            build_id=version,
            activity_task_poller_behavior=PollerBehaviorSimpleMaximum(1),
        )
        # At most n live sandboxes, each with one host activity at a time (scaffold, verify,
        # teardown run in turn): 2n slots never make one wait behind the others.
        self.host = Worker(
            self.client,
            task_queue=queue,
            activities=[steps.prepare_step, scaffold.run_scaffold, verify.verify, sandbox.teardown],
            max_concurrent_activities=2 * n,
            graceful_shutdown_timeout=grace,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            build_id=version,
        )
        metrics.serve(settings.metrics_port)
        # What this host queue left on the engine before a restart: nothing of it is live now.
        left = await self.backend.reap(0)
        if left.removed:
            log.warning("removed sandboxes an earlier run of %s left: %s", queue, left.removed)
        await sandbox.lease_round()  # registered before the first set-up is polled

    async def _run(self) -> None:
        workers = (self.workflows, self.setups, self.host)
        tasks = [asyncio.create_task(w.run()) for w in workers]
        reaper = asyncio.create_task(self._reap_forever())
        admitting = asyncio.create_task(
            self.admission.run(self._sensors, self.settings.admission_interval_s, self._report_admission)
        )
        lease = asyncio.create_task(self._lease_forever())
        log.info("polling %s and %s", self.settings.task_queue, self.host_queue)
        try:
            stopped = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopped:
                    task.result()  # a worker died: surface its error
        finally:
            reaper.cancel()
            admitting.cancel()
            await self._drain()
            lease.cancel()
            await self.lease.unregister()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(StorageError):  # a stale report is marked stale by its age
                await asyncio.to_thread(self._store.delete, admission_key(self._worker_id))
            if self.proxy is not None:
                try:
                    await asyncio.to_thread(unregister_proxy, self._store, self._worker_id)
                except StorageError:  # a stale entry is skipped by every broadcast
                    log.warning("could not remove this worker's proxy entry from the store")
                await self.proxy.stop()
            self.backend.close()

    async def _drain(self) -> None:
        """Take no new sandboxes, let the trials whose sandboxes live here run to their end
        (scaffold, verify, teardown on this host queue; the result stored by this or any
        worker), then stop; all within `drain_grace_s`.

        Workflow tasks and result storage keep being served meanwhile, so a lone worker
        can still finish its trials. Sandboxes whose trials do not finish in time stay for
        the reaper; their workflows start a new attempt elsewhere (host lost).
        """
        grace = self.settings.drain_grace_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        owned = self.sandboxes.live_workflows()
        log.info("draining: %d sandbox(es), grace %.0fs", self.sandboxes.live, grace)
        await self.setups.shutdown()
        while loop.time() < deadline:
            if not self.sandboxes.live and not await self._running_any(owned):
                break
            await asyncio.sleep(0.5)
        else:
            log.warning("drain grace over with %d sandbox(es) left", self.sandboxes.live)
        await asyncio.gather(self.host.shutdown(), self.workflows.shutdown())

    async def _running_any(self, workflow_ids: set[str]) -> bool:
        """True while any of these workflows is still open."""
        for workflow_id in workflow_ids:
            desc = await self.client.get_workflow_handle(workflow_id).describe()
            if desc.status == WorkflowExecutionStatus.RUNNING:
                return True
        return False

    def _report_admission(self) -> None:
        """Write this worker's admission report (`trialflow status`), one write at a time."""
        if self._reporting is not None and not self._reporting.done():
            return
        body = self.admission.report(self._worker_id).model_dump_json().encode()
        key = admission_key(self._worker_id)
        self._reporting = asyncio.create_task(asyncio.to_thread(self._put_quietly, key, body))

    def _put_quietly(self, key: str, body: bytes) -> None:
        try:
            self._store.put_bytes(key, body, "application/json")
        except StorageError as exc:  # status then shows the last report, or none
            log.warning("admission report not written: %s", exc)

    async def _lease_forever(self) -> None:
        """The host's lease rounds (trialflow.fencing.HostLease), every `host_lease_s / 3`."""
        while True:
            await asyncio.sleep(self.settings.host_lease_s / 3)
            try:
                await self.sandboxes.lease_round()
            except Exception:  # a bug here must not end the rounds: the next one tries again
                log.exception("lease round failed")

    async def _reap_forever(self) -> None:
        while True:
            report = await self.backend.reap(self.settings.reap_after_s)
            if report.removed:
                log.warning("reaped leaked sandboxes: %s", report.removed)
            await asyncio.sleep(REAP_INTERVAL_S)


async def serve(settings: TrialflowSettings, on_ready: Callable[[WorkerProcess], None] | None = None) -> None:
    """Run a worker until SIGTERM/SIGINT, then drain (`worker_main.py`, `trialflow worker`).
    `on_ready` is called once the workers poll (the CLI says so)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    check_fleet_store(settings)
    async with WorkerProcess(settings) as process:
        if on_ready is not None:
            on_ready(process)
        await process.wait(stop)
