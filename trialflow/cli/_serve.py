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


def worker(
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
    max_concurrent_trials: Annotated[int | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT (then drain)."""
    from proxy import eventloop
    from trialflow.worker import serve

    settings = settings_from_flags(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
        max_concurrent_trials=max_concurrent_trials,
        metrics_port=metrics_port,
    )

    async def register() -> None:
        client = await batch.connect(settings.temporal_address, settings.temporal_namespace)
        await batch.ensure_search_attributes(client, settings.temporal_namespace)

    asyncio.run(register())
    eventloop.run(serve(settings))


def proxy(
    model_dir: Annotated[Path, typer.Option(help="tokenizer + chat template dir")],
    replicas: ReplicaOpt = None,
    host: str = "127.0.0.1",
    port: int = 8100,
) -> None:
    """Run the proxy standalone (management API + protocol routes) until interrupted."""
    from proxy import eventloop
    from proxy.server import ProxyServer

    server = ProxyServer(model_dir=model_dir, host=host, port=port, replicas=replicas or ())
    console.print(f"proxy on http://{host}:{port}  (POST /sessions to open a session)")
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(server.serve())
