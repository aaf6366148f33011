"""Sandboxes: the `Sandbox` / `SandboxBackend` ABCs (lifecycle in `base`), the Docker
backend and the label-based reaper. A Kubernetes backend would implement the same ABCs."""

from trialflow.sandbox.base import (
    ExecResult,
    ImageInfo,
    Mount,
    ReapReport,
    Sandbox,
    SandboxBackend,
)
from trialflow.sandbox.docker import DockerBackend, DockerSandbox, resolve_env
from trialflow.sandbox.reaper import (
    LABEL_CREATED_AT,
    LABEL_MANAGED,
    LABEL_TRIAL_ID,
    reap_containers,
)

__all__ = [
    "LABEL_CREATED_AT",
    "LABEL_MANAGED",
    "LABEL_TRIAL_ID",
    "DockerBackend",
    "DockerSandbox",
    "ExecResult",
    "ImageInfo",
    "Mount",
    "ReapReport",
    "Sandbox",
    "SandboxBackend",
    "reap_containers",
    "resolve_env",
]
