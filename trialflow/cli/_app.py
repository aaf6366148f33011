"""The typer app, the console, the options several commands share, flags -> settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from trialflow.settings import TrialflowSettings, load_settings

app = typer.Typer(help="Durable, token-exact agent rollouts on Temporal.", no_args_is_help=True)
console = Console()

TemporalOpt = Annotated[str | None, typer.Option("--temporal-address", help="host:port")]
S3Opt = Annotated[
    str | None,
    typer.Option("--s3-endpoint", help="S3 endpoint URL (else a local store)"),
]
StoreDirOpt = Annotated[Path | None, typer.Option("--store-dir", help="local store directory")]
ReplicaOpt = Annotated[list[str] | None, typer.Option("--replica", help="vLLM replica URL (repeatable)")]
ModelDirOpt = Annotated[Path | None, typer.Option("--model-dir", help="tokenizer + chat template dir")]


def settings_from_flags(**flags) -> TrialflowSettings:
    """Settings from the environment, overridden by the flags given (None = not given)."""
    renamed = {
        "temporal_address": flags.pop("temporal", None),
        "s3_endpoint": flags.pop("s3", None),
        "store_dir": flags.pop("store_dir", None),
        "replica_urls": flags.pop("replicas", None) or None,
        "model_dir": flags.pop("model_dir", None),
    }
    if renamed["s3_endpoint"] and renamed["store_dir"]:
        raise typer.BadParameter("give --s3 or --store-dir, not both (one result store per run)")
    try:
        settings = load_settings(**renamed, **flags)
    except ValidationError as err:  # a flag's or a TRIALFLOW_* variable's value: one line each
        for e in err.errors():
            name = ".".join(str(part) for part in e["loc"])
            console.print(
                f"[red]error:[/] setting {name} (TRIALFLOW_{name.split('.')[0].upper()} or its flag): {e['msg']}",
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(2) from None
    if renamed["store_dir"] is not None and settings.s3_endpoint:
        # the flag names this run's store: it wins over an endpoint in the environment
        settings = settings.model_copy(update={"s3_endpoint": None})
    return settings


def say_store(settings: TrialflowSettings) -> None:
    """One line naming where results go, so a local directory is never chosen silently."""
    if settings.s3_endpoint:
        where = f"S3 {settings.s3_endpoint} bucket {settings.s3_bucket}"
    else:
        where = f"the local directory {settings.store_dir} (no S3 endpoint: --s3 or TRIALFLOW_S3_ENDPOINT)"
    console.print(f"results go to {where}", highlight=False, soft_wrap=True)
