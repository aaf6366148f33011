"""The sandbox fixtures of tests/trialflow (real Docker engine), for the attacks here."""

from tests.trialflow.conftest import backend, base_image, make_backend, sandbox_for

__all__ = ["backend", "base_image", "make_backend", "sandbox_for"]
