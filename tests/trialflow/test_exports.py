"""Pins the public surface of the sandbox, scaffold and compose packages."""

from trialflow import compose, sandbox, scaffolds


def test_compose_exports():
    assert sorted(compose.__all__) == [
        "BindMount",
        "COMPOSE_FILE",
        "ComposeInvalid",
        "ComposeProject",
        "ComposeRefused",
        "ComposeService",
        "Condition",
        "Dependency",
        "MAIN",
        "ServiceBuild",
        "ServiceHealthcheck",
        "interpolation_env",
        "load_compose",
    ]


def test_sandbox_exports():
    assert sorted(sandbox.__all__) == [
        "DockerBackend",
        "DockerSandbox",
        "ExecResult",
        "ImageInfo",
        "LABEL_CREATED_AT",
        "LABEL_MANAGED",
        "LABEL_TRIAL_ID",
        "Mount",
        "ReapReport",
        "Sandbox",
        "SandboxBackend",
        "reap_containers",
        "resolve_env",
    ]
    assert all(hasattr(sandbox, name) for name in sandbox.__all__)


def test_scaffold_exports():
    assert sorted(scaffolds.__all__) == [
        "Scaffold",
        "ScaffoldContext",
        "ScaffoldResult",
        "available_scaffolds",
        "check_scaffold",
        "get_scaffold",
        "register_scaffold",
        "scaffold_class",
    ]
    assert all(hasattr(scaffolds, name) for name in scaffolds.__all__)


def test_admission_exports():
    from trialflow import admission

    assert sorted(admission.__all__) == [
        "Admission",
        "AdmissionReport",
        "Binding",
        "Gate",
        "Mark",
        "Policy",
        "Pressure",
        "ReplicaSignals",
        "SandboxSignals",
        "SandboxSlots",
        "Sensors",
        "Signals",
        "StartStats",
        "State",
        "Usage",
        "admission_key",
        "read_reports",
        "step",
    ]
    assert all(hasattr(admission, name) for name in admission.__all__)
