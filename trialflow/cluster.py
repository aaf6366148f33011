"""What a worker host needs to join a cluster (docs/deploy.md): its Temporal connection (TLS,
mTLS, API key), its stable identity, the address other hosts reach it at, and the rule that a
standalone worker does not run on a one-machine store.

Pure functions of `TrialflowSettings`, apart from reading the certificate files named there.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from temporalio.client import Client
from temporalio.service import TLSConfig

from trialflow import batch
from trialflow.settings import TrialflowSettings


class ClusterConfigError(ValueError):
    """A cluster setting is unusable (a missing certificate file, a local store on a fleet
    worker); the message is the one line the user sees."""


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as err:
        raise ClusterConfigError(f"{what} {path}: {err.strerror or err}") from None


def temporal_tls(settings: TrialflowSettings) -> TLSConfig | bool:
    """temporalio's `tls` argument: False (plain), True (system roots), or a `TLSConfig` with
    the CA, client certificate/key (mTLS) and server name the settings give. An API key alone
    turns TLS on (Temporal Cloud); `temporal_tls=False` keeps it off (a key over a plain
    connection to a self-hosted proxy)."""
    files = (settings.temporal_tls_ca, settings.temporal_tls_cert, settings.temporal_tls_key)
    wanted = settings.temporal_tls
    if wanted is None:
        wanted = settings.temporal_api_key is not None or any(f is not None for f in files)
    if not wanted:
        return False
    if (settings.temporal_tls_cert is None) != (settings.temporal_tls_key is None):
        raise ClusterConfigError("mTLS needs both temporal_tls_cert and temporal_tls_key")
    if not any(f is not None for f in files) and settings.temporal_tls_server_name is None:
        return True
    return TLSConfig(
        server_root_ca_cert=_read(settings.temporal_tls_ca, "Temporal CA file"),
        client_cert=_read(settings.temporal_tls_cert, "Temporal client certificate"),
        client_private_key=_read(settings.temporal_tls_key, "Temporal client key"),
        domain=settings.temporal_tls_server_name,
    )


async def connect_temporal(settings: TrialflowSettings) -> Client:
    """The Temporal client the settings describe (address, namespace, TLS, API key)."""
    return await batch.connect(
        settings.temporal_address,
        settings.temporal_namespace,
        tls=temporal_tls(settings),
        api_key=settings.temporal_api_key,
    )


def worker_id(settings: TrialflowSettings, *, in_process: bool = False) -> str:
    """`settings.worker_id`, else the host name for a standalone worker (stable across
    restarts), else this process's id for `run`'s in-process worker (it lives and dies with
    the command)."""
    if settings.worker_id:
        return settings.worker_id
    return str(os.getpid()) if in_process else socket.gethostname()


def advertised_host(settings: TrialflowSettings) -> str:
    """The host other machines reach this worker's listeners at."""
    return settings.advertise_host or settings.proxy_host


def check_fleet_store(settings: TrialflowSettings) -> None:
    """A standalone worker's store must be reachable from every host: S3, or a local
    directory only with `allow_local_store` (one machine, or a shared file system)."""
    if not settings.s3_endpoint and not settings.allow_local_store:
        raise ClusterConfigError(
            f"worker: no S3 endpoint (TRIALFLOW_S3_ENDPOINT); the local store {settings.store_dir} "
            "is seen by this machine only. Set TRIALFLOW_ALLOW_LOCAL_STORE=1 to run on it anyway."
        )
