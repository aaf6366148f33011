import pytest

from activities._support import application_error
from trialflow import errors as E


@pytest.mark.parametrize(
    ("cls", "retryable"),
    [
        (E.TaskInvalid, False),
        (E.UnsupportedEnvironment, False),
        (E.ImageBuildFailed, False),
        (E.ImageBuildTimeout, True),
        (E.ImageUnavailable, False),
        (E.ImagePullFailed, True),
        (E.DockerfileUnsupported, False),
        (E.BaseImageUnavailable, True),
        (E.SandboxStartFailed, True),
        (E.ServiceFailed, False),
        (E.ServiceUnhealthy, False),
        (E.ServiceStartTimeout, True),
        (E.SandboxLost, True),
        (E.SandboxPathNotFound, False),
        (E.OutputBudgetExceeded, False),
        (E.SandboxRestartFailed, False),
        (E.ToolchainUnavailable, False),
        (E.VerifierTimeout, False),
        (E.RewardMissing, False),
        (E.UnknownScaffold, False),
        (E.ScaffoldSetupFailed, True),
        (E.ModelNotConfigured, False),
        (E.InvalidSampling, False),
        (E.ReplicaUnavailable, True),
        (E.StorageError, True),
        (E.ObjectNotFound, False),
        (E.ObjectExists, False),
        (E.AttemptFenced, False),
        (E.HostFenced, True),
    ],
)
def test_retry_rule_per_type(cls, retryable):
    assert cls.retryable is retryable
    converted = application_error(cls.__new__(cls))
    assert converted.type == cls.__name__ and converted.non_retryable is (not retryable)


def _all_subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_all_subclasses(sub))]


def test_every_error_is_drawn_in_the_tree():
    doc = E.__doc__
    for cls in _all_subclasses(E.TrialflowError):
        assert cls.__name__ in doc, cls


def test_task_invalid_names_file_and_field():
    err = E.TaskInvalid("/t", "task.toml", "verifier.timeout_sec", "must be positive")
    assert (err.file, err.field) == ("task.toml", "verifier.timeout_sec")
    assert "task.toml:verifier.timeout_sec" in str(err)


def test_key_error_subclasses_keep_readable_messages():
    assert str(E.UnknownScaffold("unknown scaffold 'x'")) == "unknown scaffold 'x'"
    assert isinstance(E.ObjectNotFound("k"), KeyError)
    assert isinstance(E.SandboxPathNotFound("p"), FileNotFoundError)


def test_image_build_failed_carries_log_tail():
    err = E.ImageBuildFailed("build failed", "line 1\nline 2")
    assert err.log_tail == "line 1\nline 2"
    assert "line 2" in str(err)
