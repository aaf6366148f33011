"""GPUs for tasks that ask for them: the NVIDIA driver's count, the engine's device request
(as Harbor's compose `deploy.resources.reservations.devices`), and the refusal on a host with
too few (this one has none, so the refusal is what runs here; the request itself is checked
in the container the engine creates)."""

from __future__ import annotations

import shutil

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.errors import GpusUnavailable
from trialflow.sandbox.gpus import device_requests, gpu_problem, host_gpus
from trialflow.tasks import load_task


def test_the_drivers_gpu_directories_are_counted(tmp_path):
    gpus = tmp_path / "proc/driver/nvidia/gpus"
    assert host_gpus(gpus) == 0  # no driver loaded: no directory at all
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text("Model: NVIDIA H100\n")
    assert host_gpus(gpus) == 2


def test_device_requests_as_harbor_asks_the_engine():
    assert device_requests(None) == [] and device_requests(0) == []
    [request] = device_requests(2)
    assert (request["Driver"], request["Count"], request["Capabilities"]) == ("nvidia", 2, [["gpu"]])


def test_too_few_gpus_is_a_one_line_problem():
    assert gpu_problem("[environment]", 2, 2) is None and gpu_problem("[environment]", None, 0) is None
    assert gpu_problem("[environment]", 1, 0) == (
        "[environment].gpus = 1: this host has no GPUs (the NVIDIA driver lists 0)"
    )
    assert gpu_problem("[verifier.environment]", 4, 2) == (
        "[verifier.environment].gpus = 4: this host has only 2 GPUs (the NVIDIA driver lists 2)"
    )


def _gpu_task(tmp_path, gpus: int):
    root = tmp_path / f"gpu-{gpus}"
    shutil.copytree(EXAMPLES / "create-file", root)
    toml = (root / "task.toml").read_text().replace("[environment]\n", f"[environment]\ngpus = {gpus}\n")
    (root / "task.toml").write_text(toml)
    return load_task(root)


@pytest.mark.docker
async def test_a_gpu_task_on_a_host_without_gpus_is_refused_before_a_container_exists(
    make_backend, docker_client, tmp_path
):
    backend = make_backend(host_gpus=0)
    with pytest.raises(GpusUnavailable, match=r"\[environment\]\.gpus = 1: this host has no GPUs"):
        await backend.create(_gpu_task(tmp_path, 1), trial_id="test-gpu")
    scope = [f"{k}={v}" for k, v in backend.labels.items()]
    assert docker_client.containers.list(all=True, filters={"label": scope}) == []
    assert not GpusUnavailable.retryable


@pytest.mark.docker
async def test_the_device_request_reaches_the_engine(make_backend, tmp_path):
    """Where the host has GPUs, the container carries the request (the engine here has no
    NVIDIA driver to honour it at start, so the created container is only inspected)."""
    backend = make_backend(host_gpus=2)
    sb = await backend.create(_gpu_task(tmp_path, 2), trial_id="test-gpu")
    try:
        host = backend.client.api.inspect_container(sb.container_id)["HostConfig"]
        [request] = host["DeviceRequests"]
        assert (request["Driver"], request["Count"], request["Capabilities"]) == ("nvidia", 2, [["gpu"]])
    finally:
        await sb.stop()
