"""The Docker backend through the backend-neutral sandbox suite (`contract.SandboxContract`)."""

import pytest

from tests.trialflow.sandbox.contract import SandboxContract

pytestmark = pytest.mark.docker


class TestDockerSandboxContract(SandboxContract):
    @pytest.fixture
    def sandbox_backend(self, make_backend):
        """A DockerBackend with a label of its own (reap(0) reaches only its sandboxes),
        offline images; conftest's make_backend fails the test on a container left behind."""
        return make_backend()
