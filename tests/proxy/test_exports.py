"""Pins the public surface of ``proxy`` and keeps ``import proxy.chat`` light."""

from __future__ import annotations

import subprocess
import sys

import proxy

EXPECTED = {
    "BackendError",
    "ChatRequest",
    "CheckpointSink",
    "CompletionRequest",
    "ContextExhausted",
    "DirectorySink",
    "Generation",
    "MemorySink",
    "ParsedOutput",
    "ProtocolError",
    "ProxyError",
    "ProxyServer",
    "ReplicaPool",
    "ReplicaUnreachable",
    "SamplingParams",
    "Session",
    "SessionConfig",
    "SessionHandle",
    "ToolCall",
    "Trajectory",
    "TurnOutcome",
    "VLLMClient",
}


def test_exports_are_pinned_and_resolve():
    assert set(proxy.__all__) == EXPECTED
    for name in proxy.__all__:
        assert getattr(proxy, name).__name__ == name


def test_unknown_attribute_raises():
    try:
        proxy.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_chat_does_not_pull_io_stack():
    code = "import sys, proxy.chat; print(sorted(m for m in ('aiohttp', 'numpy', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_parser_exports_are_pinned():
    import proxy.parsers

    assert set(proxy.parsers.__all__) == {
        "REASONING_PARSERS",
        "TOOL_PARSERS",
        "ExtractedCalls",
        "HarmonyUnavailable",
        "Markup",
        "OutputDecoder",
        "Piece",
        "Registry",
        "check_parsers",
        "markup_of",
        "parse_output",
        "starts_inside_reasoning",
        "strip_text_suffix",
        "text_of",
        "use_vocabulary",
    }
    assert all(hasattr(proxy.parsers, n) for n in proxy.parsers.__all__)
    # importing the parsers does not load openai-harmony (it is imported on first harmony use)
    code = "import sys, proxy.parsers; print('openai_harmony' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_renamed_replica_error_still_imports_with_a_warning():
    """`ReplicaUnreachable` (a replica call without an answer) was `ReplicaUnavailable`, the
    name the pipeline keeps for an attempt whose model pool was down."""
    import pytest

    from proxy import errors
    from trialflow.errors import ReplicaUnavailable as PipelineReplicaUnavailable

    with pytest.warns(DeprecationWarning, match="ReplicaUnreachable"):
        from proxy.errors import ReplicaUnavailable
    assert ReplicaUnavailable is errors.ReplicaUnreachable
    assert not issubclass(PipelineReplicaUnavailable, errors.ProxyError)
    assert "ReplicaUnavailable" not in proxy.__all__
    with pytest.raises(AttributeError, match="NoSuchError"):
        errors.NoSuchError  # noqa: B018
