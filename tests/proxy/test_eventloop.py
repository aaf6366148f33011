"""proxy.eventloop: uvloop by default, the stdlib loop on request, typos refused."""

import asyncio

import pytest
import uvloop

from proxy import eventloop


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_default_is_uvloop(monkeypatch):
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.run(_loop_type()) is uvloop.Loop


def test_asyncio_can_be_forced(monkeypatch):
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert not issubclass(eventloop.run(_loop_type()), uvloop.Loop)


def test_unknown_choice_is_an_error(monkeypatch):
    monkeypatch.setenv(eventloop.ENV, "uvlop")
    with pytest.raises(ValueError, match="TRIALFLOW_EVENT_LOOP"):
        eventloop.loop_factory()
