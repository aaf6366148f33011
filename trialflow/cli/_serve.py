"""`worker` and `proxy`: the long-running processes, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated

import typer

from trialflow import batch
from trialflow.cli._app import (
    ModelDirOpt,
    ReplicaOpt,
    S3Opt,
    StoreDirOpt,
    TemporalOpt,
    console,
    settings_from_flags,
)
from trialflow.cluster import ClusterConfigError, check_fleet_store, connect_temporal, temporal_tls


def worker(
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
    max_concurrent_trials: Annotated[int | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    allow_local_store: Annotated[
        bool | None,
        typer.Option("--allow-local-store", help="run on the local directory store (one machine only)"),
    ] = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT (then drain). Its store must be S3 (every host
    reads it) unless --allow-local-store."""
    from proxy import eventloop
    from trialflow.cli._worker import serve
    from trialflow.errors import UnknownSandboxBackend
    from trialflow.sandbox.registry import check_backend

    settings = settings_from_flags(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
        max_concurrent_trials=max_concurrent_trials,
        metrics_port=metrics_port,
        allow_local_store=allow_local_store,
    )
    try:  # a typo in TRIALFLOW_SANDBOX_BACKEND: one line, before Temporal is touched
        check_backend(settings)
    except UnknownSandboxBackend as err:
        raise typer.BadParameter(str(err), param_hint="TRIALFLOW_SANDBOX_BACKEND") from None
    try:
        check_fleet_store(settings)
        temporal_tls(settings)
    except ClusterConfigError as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None

    async def register() -> None:
        client = await connect_temporal(settings)
        await batch.ensure_search_attributes(client, settings.temporal_namespace)

    asyncio.run(register())

    def ready(process) -> None:
        proxy = (
            f", proxy {process.proxy.base_url}"
            if process.proxy is not None
            else ", no model (model-free scaffolds only)"
        )
        console.print(
            f"worker ready: Temporal {settings.temporal_address} queue {settings.task_queue} "
            f"(host queue {process.host_queue}){proxy}; SIGTERM or Ctrl-C drains and stops",
            highlight=False,
            soft_wrap=True,
        )

    eventloop.run(serve(settings, on_ready=ready))


def proxy(
    model_dir: Annotated[Path, typer.Option(help="tokenizer + chat template dir")],
    replicas: ReplicaOpt = None,
    host: str = "127.0.0.1",
    port: int = 8100,
    management_socket: Annotated[
        Path, typer.Option(help="Unix socket of the management API (mode 0600)")
    ] = Path(".trialflow/proxy-management.sock"),
) -> None:
    """Run the proxy standalone until interrupted: protocol routes on host:port, the
    management API on its own Unix socket with a bearer token (TRIALFLOW_PROXY_TOKEN, or
    generated and printed). gpt-oss's harmony parser reads its vocabulary from the setting
    `harmony_vocab_dir` (default .cache/tiktoken; TRIALFLOW_HARMONY_VOCAB_DIR or
    TIKTOKEN_ENCODINGS_BASE)."""
    import os

    from proxy import eventloop
    from proxy.parsers import use_vocabulary
    from proxy.server import ProxyServer
    from trialflow.cli._worker import replica_pools
    from trialflow.settings import load_settings

    settings = load_settings()
    use_vocabulary(settings.harmony_vocab_dir)
    pools = replica_pools(settings)  # the outage hold: TRIALFLOW_REPLICA_OUTAGE_HOLD_S

    management_socket.parent.mkdir(parents=True, exist_ok=True)
    server = ProxyServer(
        model_dir=model_dir,
        host=host,
        port=port,
        pool=pools(replicas or ()),
        pool_factory=pools,
        management_socket=management_socket,
        management_token=os.environ.get("TRIALFLOW_PROXY_TOKEN") or None,
    )
    console.print(
        f"proxy on http://{host}:{port}; management API on unix:{management_socket} "
        f"(header 'Authorization: Bearer {server.management_token}'; POST /sessions opens a session)"
    )
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(server.serve())
