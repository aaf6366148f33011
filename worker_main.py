"""One trialflow worker process: Temporal worker + in-process proxy + sandbox backend.

Wiring only. Three Temporal workers share one client:
- the shared queue (`settings.task_queue`, default `SHARED_QUEUE`): TrialWorkflow,
  result storage and the teardown fallback;
- its set-up queue (`setup_queue`): new sandboxes, on this process's engine (a drain
  stops this one first);
- this process's host queue (`host_queue(hostname, worker_id)`): scaffold, verify and
  teardown of the sandboxes this process created.

SIGTERM/SIGINT drain (`WorkerProcess._drain`): no new sandboxes are taken, the trials
whose sandboxes live here run to their teardown, within `drain_grace_s` in all; then the
workers stop (running activities are cancelled after the grace) and the proxy and
backend close.

Run: ``python worker_main.py [--flag value ...]`` with one flag per `TrialflowSettings`
field (``--temporal-address``, ``--replica-urls URL`` repeatable, ...); flags override
``TRIALFLOW_*`` environment variables.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import signal
import socket
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import docker
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from activities.scaffold import ScaffoldActivities
from activities.store import StoreActivities
from activities.verify import VerifyActivities
from proxy import eventloop
from trialflow.batch import connect
from trialflow.metrics import TrialMetrics
from trialflow.sandbox import DockerBackend
from trialflow.scaffolds import register_scaffold
from trialflow.settings import TrialflowSettings, load_settings
from trialflow.storage import LocalStore, ResultStore, S3Store
from workflows.shared import host_queue, setup_queue
from workflows.trial import TrialWorkflow

if TYPE_CHECKING:
    from proxy.server import ProxyServer

log = logging.getLogger("trialflow.worker")

REAP_INTERVAL_S = 600.0


@dataclass
class WorkerProcess:
    """Everything one worker process runs; `run()` until `stop` is set."""

    settings: TrialflowSettings
    client: Client
    proxy: ProxyServer | None
    backend: DockerBackend
    metrics: TrialMetrics
    host_queue: str
    sandboxes: SandboxActivities
    workflows: Worker  # shared queue: workflows, result storage, teardown fallback
    setups: Worker  # the set-up queue: new sandboxes
    host: Worker  # this process's host queue

    async def run(self, stop: asyncio.Event) -> None:
        workers = (self.workflows, self.setups, self.host)
        tasks = [asyncio.create_task(w.run()) for w in workers]
        reaper = asyncio.create_task(self._reap_forever())
        log.info("polling %s and %s", self.settings.task_queue, self.host_queue)
        try:
            stopped = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopped:
                    task.result()  # a worker died: surface its error
        finally:
            reaper.cancel()
            await self._drain()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.proxy is not None:
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
            if not self.sandboxes.live and not await self._running(owned):
                break
            await asyncio.sleep(0.5)
        else:
            log.warning("drain grace over with %d sandbox(es) left", self.sandboxes.live)
        await asyncio.gather(self.host.shutdown(), self.workflows.shutdown())

    async def _running(self, workflow_ids: set[str]) -> bool:
        """True while any of these workflows is still open."""
        for workflow_id in workflow_ids:
            desc = await self.client.get_workflow_handle(workflow_id).describe()
            if desc.status == WorkflowExecutionStatus.RUNNING:
                return True
        return False

    async def _reap_forever(self) -> None:
        while True:
            report = await self.backend.reap(self.settings.reap_after_s)
            if report.removed:
                log.warning("reaped leaked sandboxes: %s", report.removed)
            await asyncio.sleep(REAP_INTERVAL_S)


def open_store(settings: TrialflowSettings) -> ResultStore:
    """S3 when an endpoint is configured, else the local directory store."""
    if settings.s3_endpoint:
        return S3Store(
            settings.s3_endpoint,
            settings.s3_bucket,
            settings.s3_prefix,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            create_bucket=True,
        )
    return LocalStore(settings.store_dir)


def open_proxy(settings: TrialflowSettings) -> ProxyServer | None:
    """The in-process proxy; None without a model dir (model-free scaffolds only)."""
    if settings.model_dir is None:
        return None
    from proxy.server import ProxyServer
    from proxy.session import SessionConfig

    return ProxyServer(
        model_dir=settings.model_dir,
        host=settings.proxy_host,
        port=settings.proxy_port,
        replicas=settings.replica_urls,
        defaults=SessionConfig(model=settings.model_name),
    )


def build_id() -> str:
    """The workers' Temporal build id: a hash of this checkout's workflow and activity
    sources. Given explicitly because the SDK's default hashes the code of every loaded
    module, which trips over transformers' lazy modules (a warning line for each, ~200)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted([*root.glob("workflows/*.py"), *root.glob("activities/*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"trialflow-{digest.hexdigest()[:16]}"


async def build(settings: TrialflowSettings, client: Client | None = None) -> WorkerProcess:
    """Connect, start the proxy, create the activity objects and the two workers."""
    client = client or await connect(settings.temporal_address, settings.temporal_namespace)
    worker_id = settings.worker_id or str(os.getpid())
    queue = host_queue(socket.gethostname(), worker_id)
    metrics = TrialMetrics()
    for name, target in settings.extra_scaffolds.items():
        register_scaffold(name, target)
    store = open_store(settings)
    backend = DockerBackend(
        docker.from_env(), labels={"trialflow.worker": queue}, policy=settings.sandbox_policy()
    )
    proxy = open_proxy(settings)
    if proxy is not None:
        await proxy.start()
    sandbox = SandboxActivities(backend, store.uri, queue, metrics)
    scaffold = ScaffoldActivities(proxy, backend, store, metrics, client, settings.model_name)
    verify = VerifyActivities(backend, store, metrics)
    results = StoreActivities(store, metrics)
    grace = timedelta(seconds=settings.drain_grace_s)
    version = build_id()
    n = settings.max_concurrent_trials
    workflows = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[TrialWorkflow],
        activities=[sandbox.teardown, results.store_result],
        graceful_shutdown_timeout=grace,
        build_id=version,
    )
    setups = Worker(
        client,
        task_queue=setup_queue(settings.task_queue),
        activities=[sandbox.setup],
        max_concurrent_activities=n,
        graceful_shutdown_timeout=grace,
        build_id=version,
    )
    # Verify and teardown must never wait behind running scaffolds: 2 slots per trial.
    host = Worker(
        client,
        task_queue=queue,
        activities=[scaffold.run_scaffold, verify.verify, sandbox.teardown],
        max_concurrent_activities=2 * n,
        graceful_shutdown_timeout=grace,
        build_id=version,
    )
    metrics.serve(settings.metrics_port)
    return WorkerProcess(
        settings,
        client,
        proxy,
        backend,
        metrics,
        queue,
        sandbox,
        workflows,
        setups,
        host,
    )


async def serve(settings: TrialflowSettings) -> None:
    """Run until SIGTERM/SIGINT, then drain."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    process = await build(settings)
    await process.run(stop)


def parse_args(argv: Sequence[str] | None = None) -> TrialflowSettings:
    """One flag per settings field; list fields are repeatable flags, dict fields JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, field in TrialflowSettings.model_fields.items():
        origin = typing.get_origin(field.annotation)
        flag = "--" + name.replace("_", "-")
        if origin is list:
            parser.add_argument(flag, dest=name, action="append")
        elif origin is dict:
            parser.add_argument(flag, dest=name, type=json.loads)
        else:
            parser.add_argument(flag, dest=name)
    return load_settings(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    eventloop.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
