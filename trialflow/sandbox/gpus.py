"""GPUs for tasks that ask for them (`[environment] gpus`), as Harbor 0.25's docker
environment gives them: an engine device request for that many NVIDIA GPUs with the "gpu"
capability (Harbor's compose `deploy.resources.reservations.devices`; here the docker SDK's
`DeviceRequest` on the container), `gpu_types` ignored with a warning (the engine cannot
pick a GPU model; Harbor warns the same).

Where the host has fewer GPUs than a task asks for, the task is refused before anything is
submitted (`trialflow.preflight`, for the in-process worker's host) and, on a worker whose
host has too few, at sandbox creation (`GpusUnavailable`, not retried). The count is the
NVIDIA driver's: one directory per GPU under /proc/driver/nvidia/gpus (present only with
the driver loaded); the engine also needs the NVIDIA container toolkit to honour the
request, which it reports itself when the container is created.
"""

from __future__ import annotations

from pathlib import Path

import docker.types

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def host_gpus(root: Path = NVIDIA_GPUS) -> int:
    """How many NVIDIA GPUs this host's driver lists (0: no driver, no GPUs)."""
    try:
        return sum(1 for entry in root.iterdir() if entry.is_dir())
    except OSError:
        return 0


def device_requests(gpus: int | None) -> list[docker.types.DeviceRequest]:
    """The container's device requests for `gpus` GPUs (none for None or 0)."""
    if not gpus:
        return []
    return [docker.types.DeviceRequest(driver="nvidia", count=gpus, capabilities=[["gpu"]])]


def gpu_problem(where: str, asked: int | None, available: int) -> str | None:
    """Why a sandbox asking for `asked` GPUs cannot have them on a host with `available`
    (None: it can). `where` names the section (``[environment]``)."""
    if not asked or asked <= available:
        return None
    have = "no GPUs" if available == 0 else f"only {available} GPU{'s' if available > 1 else ''}"
    return f"{where}.gpus = {asked}: this host has {have} (the NVIDIA driver lists {available})"
