"""trialflow.cluster: Temporal TLS/mTLS/API-key options, worker identity, the store rule; the
advertised management URL; `worker` refusing a local store in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from trialflow.cluster import (
    ClusterConfigError,
    advertised_host,
    check_fleet_store,
    temporal_tls,
    worker_id,
)
from trialflow.settings import load_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("TRIALFLOW_"):
            monkeypatch.delenv(name)


def test_plain_by_default_and_tls_on_with_a_key_or_files(tmp_path):
    assert temporal_tls(load_settings()) is False
    assert temporal_tls(load_settings(temporal_tls=True)) is True  # system roots
    assert temporal_tls(load_settings(temporal_api_key="k")) is True  # Temporal Cloud
    assert temporal_tls(load_settings(temporal_api_key="k", temporal_tls=False)) is False
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nx\n")
    cfg = temporal_tls(load_settings(temporal_tls_ca=ca, temporal_tls_server_name="temporal.internal"))
    assert isinstance(cfg, TLSConfig)
    assert cfg.server_root_ca_cert == ca.read_bytes() and cfg.domain == "temporal.internal"
    assert cfg.client_cert is None and cfg.client_private_key is None


def test_mtls_needs_both_halves_and_readable_files(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(b"cert")
    key.write_bytes(b"key")
    cfg = temporal_tls(load_settings(temporal_tls_cert=cert, temporal_tls_key=key))
    assert isinstance(cfg, TLSConfig) and (cfg.client_cert, cfg.client_private_key) == (b"cert", b"key")
    with pytest.raises(ClusterConfigError, match="both temporal_tls_cert and temporal_tls_key"):
        temporal_tls(load_settings(temporal_tls_cert=cert))
    with pytest.raises(ClusterConfigError, match="Temporal CA file .*missing.pem"):
        temporal_tls(load_settings(temporal_tls_ca=tmp_path / "missing.pem"))


def test_worker_ids_are_stable_for_a_standalone_worker():
    assert worker_id(load_settings(worker_id="gpu-7")) == "gpu-7"
    assert worker_id(load_settings()) == socket.gethostname()  # the same after a restart
    assert worker_id(load_settings(), in_process=True) == str(os.getpid())


def test_the_advertised_host_defaults_to_the_bind_address():
    assert advertised_host(load_settings(proxy_host="0.0.0.0", advertise_host="10.0.3.7")) == "10.0.3.7"
    assert advertised_host(load_settings()) == "127.0.0.1"


def test_a_standalone_worker_refuses_a_local_store_unless_allowed(tmp_path):
    with pytest.raises(ClusterConfigError, match="TRIALFLOW_ALLOW_LOCAL_STORE=1"):
        check_fleet_store(load_settings(store_dir=tmp_path))
    check_fleet_store(load_settings(store_dir=tmp_path, allow_local_store=True))
    check_fleet_store(load_settings(s3_endpoint="http://127.0.0.1:1"))


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "worker_main.py"],
        [sys.executable, "-c", "from trialflow.cli import app; app()", "worker"],
    ],
    ids=["worker_main", "trialflow worker"],
)
def test_worker_entry_points_say_so_in_one_line(argv, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALFLOW_")}
    env["TRIALFLOW_STORE_DIR"] = str(tmp_path / "store")
    env["TRIALFLOW_TEMPORAL_ADDRESS"] = "127.0.0.1:1"  # never reached: refused before
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "no S3 endpoint" in out and "TRIALFLOW_ALLOW_LOCAL_STORE=1" in out
    assert not (tmp_path / "store").exists()  # nothing made
