"""`view`: the trajectory viewer (trialflow.viewer) over the store, until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated
from urllib.parse import urlsplit

import typer

from trialflow.cli._app import ModelDirOpt, S3Opt, StoreDirOpt, console, settings_from_flags
from trialflow.settings import TrialflowSettings


def _where(settings: TrialflowSettings) -> str:
    if settings.s3_endpoint:
        return (
            f"S3 {settings.s3_endpoint} bucket {settings.s3_bucket} prefix {settings.s3_prefix or '(none)'}"
        )
    return f"the directory {settings.store_dir}"


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)
    return typer.Exit(1)


def view(
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    model_dir: ModelDirOpt = None,
    host: Annotated[
        str | None, typer.Option(help="address to listen on (default: the viewer_url setting's)")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="port (default: the viewer_url setting's, 8234); 0: any")
    ] = None,
    temporal_ui: Annotated[
        str | None, typer.Option("--temporal-ui", help="the Temporal UI each trial page links to")
    ] = None,
) -> None:
    """Serve the trajectory viewer: batches, trials, each turn's exact tokens, logs, verifier output."""
    from rich.markup import escape

    from trialflow.errors import StorageError
    from trialflow.storage import open_store
    from trialflow.viewer._data import load_tokenizer
    from trialflow.viewer._server import Viewer, start

    settings = settings_from_flags(s3=s3, store_dir=store_dir, model_dir=model_dir)
    where = _where(settings)
    try:
        store = open_store(settings, create=False)
        store.list_children("batches/")  # a wrong key or a dead endpoint: now, as one line
    except StorageError as err:
        raise _fail(escape(f"cannot read the store ({where}): {err}")) from None
    try:
        tokenizer = load_tokenizer(settings.model_dir)
    except (OSError, ValueError) as err:
        raise _fail(escape(f"cannot load a tokenizer from {settings.model_dir}: {err}")) from None
    bind = urlsplit(settings.viewer_url)
    listen_host = host or bind.hostname or "127.0.0.1"
    listen_port = port if port is not None else (bind.port or 8234)
    viewer = Viewer(
        store, where, temporal_ui or settings.temporal_ui_url, settings.temporal_namespace, tokenizer
    )

    async def serve() -> None:
        try:
            runner, bound = await start(viewer, listen_host, listen_port)
        except OSError as err:
            raise _fail(
                escape(f"cannot listen on {listen_host}:{listen_port}: {err.strerror or err}")
            ) from None
        decoded = (
            "tokens decoded with its tokenizer"
            if tokenizer is not None
            else "tokens as ids (--model-dir decodes them)"
        )
        console.print(
            f"trajectory viewer on http://{listen_host}:{bound}/ over {escape(where)}; {decoded}. Ctrl-C stops it.",
            highlight=False,
            soft_wrap=True,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
