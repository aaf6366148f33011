"""The token-exact proxy: Anthropic Messages, OpenAI Chat Completions and Responses over vLLM replicas.

Public surface (everything else is internal). Names resolve lazily, so importing a light
submodule such as ``proxy.chat`` (workflow code does) does not pull in aiohttp, numpy or
transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ChatRequest": "proxy.chat",
    "Generation": "proxy.chat",
    "ParsedOutput": "proxy.chat",
    "SamplingParams": "proxy.chat",
    "ToolCall": "proxy.chat",
    "TurnOutcome": "proxy.chat",
    "CheckpointSink": "proxy.checkpoint",
    "DirectorySink": "proxy.checkpoint",
    "MemorySink": "proxy.checkpoint",
    "ProxyError": "proxy.errors",
    "ProtocolError": "proxy.errors",
    "BackendError": "proxy.errors",
    "ReplicaUnreachable": "proxy.errors",
    "ContextExhausted": "proxy.errors",
    "CompletionRequest": "proxy.backend",
    "VLLMClient": "proxy.backend",
    "ReplicaPool": "proxy.pool",
    "Session": "proxy.session",
    "SessionConfig": "proxy.session",
    "ProxyServer": "proxy.server",
    "SessionHandle": "proxy.server",
    "Trajectory": "proxy.trajectory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from proxy.backend import CompletionRequest, VLLMClient
    from proxy.chat import ChatRequest, Generation, ParsedOutput, SamplingParams, ToolCall, TurnOutcome
    from proxy.checkpoint import CheckpointSink, DirectorySink, MemorySink
    from proxy.errors import BackendError, ContextExhausted, ProtocolError, ProxyError, ReplicaUnreachable
    from proxy.pool import ReplicaPool
    from proxy.server import ProxyServer, SessionHandle
    from proxy.session import Session, SessionConfig
    from proxy.trajectory import Trajectory
