"""The typer app, the console, the options several commands share, flags -> settings."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from temporalio.service import RPCError

from trialflow.errors import TrialflowError
from trialflow.settings import TrialflowSettings, load_settings


class _App(typer.Typer):
    """The typer app, with the errors a user can cause (a store that refuses its keys, a
    Temporal server that is down, ...) each shown as one line, exit 1, never a traceback.
    Anything else is a bug and keeps its traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except TrialflowError as err:
            fail(one_line(err))
        except RuntimeError as err:
            if not str(err).startswith("Failed client connect"):
                raise
            fail(
                f"cannot reach Temporal{_connect_failure(str(err))}: is it up? (`trialflow up`, --temporal-address)"
            )
        except RPCError as err:
            fail(
                f"Temporal answered {err.status.name if err.status else 'an error'}: {one_line(err.message)}"
            )


class _OneLine(logging.Formatter):
    """A log record as one terminal line: no traceback (the log file has it)."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage().strip().splitlines()
        return f"{record.levelname.lower()}: {record.name}: {text[0] if text else ''}"


class _NotOutcomes(logging.Filter):
    """Keep off the terminal what the results table already says: an activity or workflow
    task that failed (a set-up failure, a crashed scaffold) is a trial's outcome there."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(("temporalio.activity", "temporalio.workflow"))


@contextlib.contextmanager
def worker_logging(log_file: Path) -> Iterator[None]:
    """Logging while a command runs a worker in this process (`run`, `replay`, `demo`): every
    record with its traceback to `log_file`, and warnings on the terminal as one line each
    (never a traceback), without the failures the results show. Handlers removed after."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_terminal = logging.StreamHandler(sys.stderr)
    to_terminal.setLevel(logging.WARNING)
    to_terminal.setFormatter(_OneLine())
    to_terminal.addFilter(_NotOutcomes())
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(to_file)
    root.addHandler(to_terminal)
    try:
        yield
    finally:
        root.removeHandler(to_terminal)
        root.removeHandler(to_file)
        to_file.close()
        root.setLevel(level)


def _connect_failure(text: str) -> str:
    """ " at ADDRESS (reason)" from the Temporal client's connect error (Rust's debug print of
    the transport error), or the error's first line when it has another shape."""
    address = re.search(r'ConnectError\("[^"]*", ([^,)]+)', text)
    reason = re.search(r'message: "([^"]+)"', text)
    if address and reason:
        return f" at {address.group(1)} ({reason.group(1).lower()})"
    return f" ({one_line(text)})"


def one_line(err: object) -> str:
    """The first line of an error's text."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def fail(message: str) -> NoReturn:
    """Print one error line, exit 1."""
    console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(1)


app = _App(help="Durable, token-exact agent rollouts on Temporal.", no_args_is_help=True)
# Piped into a log, rich would wrap every table at 80 columns: give it room there instead.
console = Console(
    width=None if sys.stdout.isatty() else max(220, shutil.get_terminal_size((220, 24)).columns)
)

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
