"""ScriptedVLLM: a TEST DOUBLE speaking vLLM's OpenAI-server wire format.

Used where the real vLLM cannot produce what a test needs (a chosen reply text such as a
hermes tool call, aborts, 500s, dropped connections, MoE routed experts — R3 does not run
on the CPU backend). It serves, in-process on a free port:

- ``POST /v1/completions`` (token-in/token-out, non-streaming): answers the next scripted
  reply with ``choices[0].{text, token_ids, prompt_token_ids, logprobs.token_logprobs,
  finish_reason, routed_experts}`` exactly as vLLM 0.32 shapes them;
- ``GET /v1/models`` and ``GET /health`` (503 while ``healthy`` is False; ``health_delay_s`` late).

Choosing a reply: requests whose decoded prompt satisfies ``match`` (default: all) pop
the next item of ``script``; other requests, and any request once the script is
exhausted, get ``default`` (a fixed ``Reply`` or a callable of the decoded prompt). That
lets a real scaffold make side calls (title generation and the like) that do not disturb
the scripted main conversation.

Partial rollout, as verl drives a replica through a weight sync: `pause` answers every
in-flight delayed reply at once as an abort (finish_reason "abort") with the first half of its
tokens and holds new requests until `resume`; ``weights_version`` is what the replica serves
(a ``default`` callable reads it when it picks a reply, which a held request does only after
the resume). Processes that drive a sync (verl's Ray actors) reach these over HTTP:
``POST /_double/pause``, ``/_double/resume``, ``/_double/weights {"version": N}``: routes of
the double only, not vLLM's (verl reaches its engines in-process). ``on_resume`` runs when
generation resumes, before any held request continues.

Every received body is kept in ``requests`` (``main_requests`` for the ones that popped
the script); ``timings`` has (arrival, answer) times of the generated replies; ``answered``
counts the generations it answered (replies and aborts; not failures or drops), which is
what a replay test asserts stays 0 while a session answers from its record.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web


@dataclass
class Reply:
    """A generation. ``text`` is tokenized with the double's tokenizer (no special tokens);
    ``token_ids`` overrides it. For finish_reason "stop" the end-of-turn token is appended
    (vLLM includes the EOS id in ``token_ids``) unless ``eos`` is False (a stop-string stop). ``experts=(layers, top_k, n_experts)``
    adds a deterministic ``routed_experts`` array [prompt + generated - 1, layers, top_k].
    ``delay_s`` sleeps before answering. ``max_tokens`` in the request truncates the reply
    to a "length" finish, as vLLM would."""

    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str = "stop"
    experts: tuple[int, int, int] | None = None
    delay_s: float = 0.0
    eos: bool = True


@dataclass
class Abort:
    """The backend aborts after generating ``text``/``token_ids`` (finish_reason "abort",
    no EOS appended), like vLLM during a weight sync."""

    text: str = ""
    token_ids: list[int] | None = None
    experts: tuple[int, int, int] | None = None


@dataclass
class HTTPFailure:
    status: int = 500
    message: str = "scripted failure"
    delay_s: float = 0.0


@dataclass
class Drop:
    """Close the connection without answering (the client sees a server disconnect)."""


Action = Reply | Abort | HTTPFailure | Drop


def _vllm_json(value: Any) -> str:
    """JSON as vLLM's server writes it (Starlette's JSONResponse: compact, UTF-8)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def fake_logprob(token_id: int, position: int) -> float:
    """Deterministic stand-in logprob, so tests can recompute the expected values."""
    return -((token_id * 7 + position * 3) % 50 + 1) / 100.0


def fake_experts(total: int, layers: int, top_k: int, n_experts: int) -> np.ndarray:
    """Deterministic int32 routing [total, layers, top_k] (position-dependent)."""
    pos = np.arange(total, dtype=np.int32)[:, None, None]
    lay = np.arange(layers, dtype=np.int32)[None, :, None]
    k = np.arange(top_k, dtype=np.int32)[None, None, :]
    return ((pos * 5 + lay * 3 + k) % n_experts).astype(np.int32)


def _bad_request(message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "BadRequestError", "code": 400}}, status=400
    )


def _b64_npy(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@dataclass
class ScriptedVLLM:
    """See module docstring. ``tokenizer`` needs ``encode``/``decode`` and the end-of-turn
    token ``eos_token`` (HF tokenizers have all three)."""

    tokenizer: Any
    script: list[Action] = field(default_factory=list)
    default: Reply | Callable[[str], Action] = field(default_factory=lambda: Reply("OK"))
    match: Callable[[str], bool] | None = None
    model: str = "scripted"
    max_model_len: int = 4096
    healthy: bool = True
    health_delay_s: float = 0.0  # /health answers this late (a server stalled by a long prefill)
    requests: list[dict[str, Any]] = field(default_factory=list)
    main_requests: list[dict[str, Any]] = field(default_factory=list)
    # (arrival, departure) monotonic times per answered request, to check serialisation.
    timings: list[tuple[float, float]] = field(default_factory=list)
    answered: int = 0
    client_gone: int = 0  # generations stopped because their client closed the connection
    weights_version: int | None = None
    on_resume: Callable[[], None] | None = None
    port: int = 0
    _runner: web.AppRunner | None = None
    _open: asyncio.Event = field(default_factory=asyncio.Event)  # set: not paused
    _cut: asyncio.Event = field(default_factory=asyncio.Event)  # set by pause: abort in-flight

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def start(self, port: int = 0) -> ScriptedVLLM:
        """Listen on ``port`` (0: a free one; pass the old port to restart after ``stop``)."""
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/_double/pause", self._control)
        app.router.add_post("/_double/resume", self._control)
        app.router.add_post("/_double/weights", self._control)
        self._open.set()
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        if port == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return self

    async def stop(self) -> None:
        """Stop listening: later connections are refused (a dead replica)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedVLLM:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def pause(self) -> None:
        """Abort in-flight delayed replies (half their tokens) and hold new requests."""
        self._open.clear()
        self._cut.set()
        self._cut = asyncio.Event()

    def resume(self) -> None:
        if self.on_resume is not None:
            self.on_resume()
        self._open.set()

    async def _control(self, request: web.Request) -> web.Response:
        op = request.path.rsplit("/", 1)[-1]
        if op == "weights":
            self.weights_version = int((await request.json())["version"])
        else:
            self.pause() if op == "pause" else self.resume()
        return web.json_response({"ok": True, "weights_version": self.weights_version})

    async def _sleep_unless_cut(self, delay_s: float, request: web.Request) -> bool:
        """Sleep ``delay_s``, or less when the client goes away (as vLLM stops generating
        then); True when a pause cut it short."""
        cut = self._cut
        until = time.monotonic() + delay_s
        while (left := until - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(cut.wait(), min(left, 0.05))
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    return False
                continue
            return True
        return False

    def _pick(self, prompt_text: str) -> Action:
        if (self.match is None or self.match(prompt_text)) and self.script:
            return self.script.pop(0)
        return self.default(prompt_text) if callable(self.default) else self.default

    def _ids(self, action: Reply | Abort) -> list[int]:
        if action.token_ids is not None:
            return list(action.token_ids)
        return list(self.tokenizer.encode(action.text, add_special_tokens=False))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        body = await request.json()
        self.requests.append(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return _bad_request("prompt must be token ids")
        max_tokens = body.get("max_tokens") or 16
        # vLLM's own request validation (its wording): these are 400s there too.
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _bad_request(f"max_tokens must be at least 1, got {max_tokens}.")
        if any(not x for x in body.get("stop") or []):
            return _bad_request("stop cannot contain an empty string.")
        if len(prompt) + max_tokens > self.max_model_len:
            return _bad_request(f"This model's maximum context length is {self.max_model_len} tokens.")
        await self._open.wait()  # held while paused (a weight sync)
        is_main = (self.match is None or self.match(self.decode(prompt))) and bool(self.script)
        action = self._pick(self.decode(prompt))
        if is_main:
            self.main_requests.append(body)
        if isinstance(action, (Reply, HTTPFailure)) and action.delay_s:
            if await self._sleep_unless_cut(action.delay_s, request) and isinstance(action, Reply):
                ids = self._ids(action)
                action = Abort(token_ids=ids[: len(ids) // 2], experts=action.experts)
            if request.transport is None or request.transport.is_closing():
                # vLLM aborts a request whose client went away (its handlers watch for the
                # disconnect): nothing is answered, only counted here
                self.client_gone += 1
                raise asyncio.CancelledError
        if isinstance(action, HTTPFailure):
            return web.json_response(
                {"error": {"message": action.message, "code": action.status}}, status=action.status
            )
        if isinstance(action, Drop):
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError  # the handler ends without a response
        ids = self._ids(action)
        reason = "abort" if isinstance(action, Abort) else action.finish_reason
        if reason == "stop" and getattr(action, "eos", False):
            ids.append(self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token))
        if len(ids) > max_tokens:
            ids, reason = ids[:max_tokens], "length"
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.decode(ids),
            "logprobs": {
                "text_offset": [0] * len(ids),
                "token_logprobs": [fake_logprob(t, len(prompt) + i) for i, t in enumerate(ids)],
                "tokens": [self.decode([t]) for t in ids],
                "top_logprobs": [None] * len(ids),
            },
            "finish_reason": reason,
            "stop_reason": None,
            "token_ids": ids,
            "prompt_logprobs": None,
            "prompt_token_ids": list(prompt),
            "routed_experts": None,
        }
        if action.experts is not None:
            layers, top_k, n = action.experts
            choice["routed_experts"] = _b64_npy(fake_experts(len(prompt) + len(ids) - 1, layers, top_k, n))
        self.timings.append((arrived, time.monotonic()))
        self.answered += 1
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        return web.json_response(
            {
                "id": f"cmpl-{len(self.requests)}",
                "object": "text_completion",
                "created": 0,
                "model": body.get("model", self.model),
                "choices": [choice],
                "usage": usage,
            },
            dumps=_vllm_json,
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "owned_by": "vllm",
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_delay_s:
            await asyncio.sleep(self.health_delay_s)
        return web.Response(status=200 if self.healthy else 503)


async def _serve(model_dir: str, port: int, text: str, delay_s: float) -> None:
    from transformers import AutoTokenizer

    double = ScriptedVLLM(AutoTokenizer.from_pretrained(model_dir), default=Reply(text, delay_s=delay_s))
    await double.start(port)
    print(f"listening {double.url}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    """``python -m tests.doubles.scripted_vllm --model-dir DIR [--port N] [--text T] [--delay-s S]``:
    the double in its own process, answering every request with ``Reply(T, delay_s=S)``
    (tests stop it with SIGSTOP to make a hung replica). Prints ``listening URL`` when up."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--text", default="OK")
    p.add_argument("--delay-s", type=float, default=0.0)
    a = p.parse_args()
    asyncio.run(_serve(a.model_dir, a.port, a.text, a.delay_s))


if __name__ == "__main__":
    main()
