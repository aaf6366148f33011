"""Messages -> prompt token ids, with the rules that keep trajectories token-exact (pure).

Public API:

    ConversationTracker(tokenizer, *, session_id="", trajectory=None, template_kwargs=None,
                        main_thread="first", prefix_cache=None)
        .trajectory: Trajectory                       the token record (see proxy.trajectory)
        .prepare(request: ChatRequest) -> PreparedTurn    no mutation
        .commit(prepared, generation, parsed, info=TurnInfo()) -> TurnRecord
        .count_tokens(request) -> int                 prompt length prepare() would send
    PreparedTurn   segment_index, kind, system_key, prompt_ids, env_ids, base_len, new_segment, .extends
    TurnInfo       started_at, latency_s, policy_version, context_limited (session-side facts)
    system_key(messages) -> str
    StalePreparedTurn, InvariantViolation (both proxy.trajectory.TrajectoryError)

``tokenizer`` is a HF tokenizer with a prefix-stable chat template (trialflow.tinymodel's, or any
template where render(messages[:k]) is a prefix of render(messages)) and ``eos_token`` = the
end-of-turn text (``<|im_end|>``). ``template_kwargs`` go to every render (e.g.
``{"enable_thinking": False}``); a request's ``thinking`` (when not None) overrides
``enable_thinking``.

Rules (all decided in ``prepare``; ``commit`` only records):

1. Routing. A request's system key is a hash of the text of all system-role messages before
   the first non-system message. The main thread's key is defined by the first committed
   request (``main_thread="first"``, the default) or by the first committed request that
   carries tools (``main_thread="first_with_tools"``: for scaffolds such as OpenCode whose
   first call is a tool-less title generation); tool-less requests before that are side calls. Requests with that key go to main segments; any other key
   goes to side segments with the same key (sub-agents, title generators, ...).
2. Extension. Candidate segments (same key and kind, newest first) are tried in turn. A
   segment is extended when the request's messages start with the segment's recorded
   conversation (the messages of its last request plus the assistant message the proxy
   returned) and the tools are the same. Messages are compared after normalization: text
   (string or text parts) stripped of surrounding whitespace; tool-call arguments compared as
   parsed JSON (clients re-serialize them); tool-call ids and ``tool_call_id`` ignored;
   an echoed assistant message without ``reasoning_content`` matches (OpenAI clients drop it),
   one with different reasoning does not.
3. Extension tokens. S_prev = render(request.messages[:m]) where m = length of the recorded
   conversation, S_full = render(request.messages, add_generation_prompt=True). Both come
   from the request itself, so a dropped reasoning block or re-serialized arguments cannot
   break the comparison. Require S_full.startswith(S_prev); cut S_prev right after its last
   EOS text (the end of the last assistant turn) and tokenize S_full[cut:] with
   add_special_tokens=False: these are the environment tokens (mask 0). The prompt is the
   segment's full sequence (prompt + every response token so far) + the environment tokens.
   The template text of earlier turns is never re-tokenized: the model's own tokens stay.
   For speed, a message-local template renders only the leading system messages plus the
   messages from the last assistant on, without the tool list; locality is probed against the
   full render once per tail shape (roles, tool calls, reasoning, thinking; ``_delta_text``).
   Known limit: a template whose locality breaks only for texts other than the probed turn's,
   within one shape, would be rendered by the shortcut.
   If the segment's last token is not EOS (finished by length, stop string or abort), the
   environment tokens start with the EOS id so the sequence is well-formed.
4. New segment. When no candidate extends (history rewritten/compacted/edited, tools
   changed, or the prefix check fails), the turn opens a new segment whose prompt is the full
   render. It is ``rewritten`` when it is a main segment and a main segment already exists.
   No logprobs are ever invented for a prompt.
5. Invariant: an extension prompt begins with the segment's previous full sequence (by
   construction: the sequence is copied, never re-rendered), and a generation reporting
   ``prompt_token_ids`` reports exactly the prompt that was prepared (checked in ``commit``,
   raises InvariantViolation).
6. A failed generation is simply never committed. ``commit`` raises ``StalePreparedTurn`` if
   the segment changed since ``prepare`` (the session serializes turns, so this is a bug).

Known limits: conversations are kept in the tracker, not in the trajectory, so a tracker
built over a recovered trajectory opens a new segment for the next request of each thread.
A client retrying a request the proxy already committed (same messages, no new
assistant message) does not extend, so it opens a new segment; a side conversation that uses
the main thread's exact system prompt is recorded as a (rewritten) main segment.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy import jsonio
from proxy.chat import ChatRequest, Generation, Message, ParsedOutput, ToolSpec, assistant_message
from proxy.errors import InvalidRequest
from proxy.prefix_cache import PrefixCache
from proxy.trajectory import (
    SegmentHeader,
    SegmentKind,
    Trajectory,
    TrajectoryError,
    TurnDelta,
    TurnRecord,
    id_array,
    same_ids,
)


MainThreadRule = Literal["first", "first_with_tools"]


class StalePreparedTurn(TrajectoryError):
    """The segment a PreparedTurn targets changed between prepare and commit."""


class InvariantViolation(TrajectoryError):
    """A token-exactness invariant does not hold (a bug, never a client error)."""


@dataclass(frozen=True)
class TurnInfo:
    """Session-side facts about a turn that the generation itself does not carry."""

    started_at: float = 0.0
    latency_s: float = 0.0
    policy_version: int | None = None
    policy_version_end: int | None = None  # when the weights changed during the turn
    # The generation's max_tokens was bounded by the context window and it finished by
    # length: the trajectory hit its limit (TurnRecord.overlong, counters.overlong).
    context_limited: bool = False
    # The answer as the client receives it (proxy.replay.answer_of), and whether the turn was
    # answered from an earlier attempt's record instead of generated (TurnRecord.answer/.source).
    answer: dict[str, Any] | None = None
    replayed: bool = False


@dataclass(frozen=True)
class PreparedTurn:
    """The decision for one request: target segment and the exact prompt ids to send.

    ``new_segment`` is set when the turn opens segment ``segment_index`` (== number of
    segments at prepare time); otherwise it extends that segment, whose full sequence had
    ``base_len`` tokens, with ``env_ids``. ``prompt_ids`` is an int32 ``array`` (built by a
    memcpy of the segment, not one int object per token); compare it with ``same_ids`` or
    ``.tolist()``, never ``==`` against a list.
    """

    segment_index: int
    kind: SegmentKind
    system_key: str
    prompt_ids: array
    env_ids: list[int]
    base_len: int
    new_segment: SegmentHeader | None
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    # Normalized request messages, computed once in prepare and reused by commit (the
    # comparison is the only per-turn work that must touch every message).
    norms: tuple[tuple, ...] = ()

    @property
    def extends(self) -> bool:
        return self.new_segment is None


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def system_key(messages: list[Message]) -> str:
    """Hash of the system-role texts before the first non-system message."""
    return _hash_texts(_system_texts(messages))


def _system_texts(messages: list[Message]) -> tuple[str, ...]:
    texts = []
    for m in messages:
        if m.get("role") != "system":
            break
        texts.append(_text(m.get("content")))
    return tuple(texts)


def _hash_texts(texts: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments


def _norm(msg: Message) -> tuple:
    """(role, text, tool calls as (name, parsed args), reasoning or None) for comparison.

    Texts longer than a digest are kept as a digest: the tracker keeps these for the whole
    conversation next to the request's own messages, and comparing only needs equality.
    """
    calls = tuple(
        (tc.get("function", tc).get("name"), _args(tc.get("function", tc).get("arguments")))
        for tc in msg.get("tool_calls") or ()
    )
    reasoning = _text(msg.get("reasoning_content")).strip() or None
    return (
        msg.get("role"),
        _compact(_text(msg.get("content")).strip()),
        calls,
        None if reasoning is None else _compact(reasoning),
    )


def _compact(text: str) -> str | bytes:
    """``text`` itself when short, else its 16-byte BLAKE2b digest (collisions: ~2^-64)."""
    if len(text) <= 32:
        return text
    return jsonio.digest(text)


def _tail_shape(messages: list[Message], m: int, thinking: bool | None) -> tuple:
    """What the template's rendering of the tail may depend on besides the texts."""
    tail = messages[m - 1 :]
    return (
        tuple(x.get("role") for x in tail),
        tuple(bool(x.get("tool_calls")) for x in tail),
        tuple(bool(x.get("reasoning_content")) for x in tail),
        thinking,
    )


def _same(recorded: tuple, echoed: tuple) -> bool:
    if recorded[:3] != echoed[:3]:
        return False
    return echoed[3] is None or echoed[3] == recorded[3]


@dataclass(frozen=True)
class _Recorded:
    """A segment's conversation as last returned to the client."""

    norms: tuple[tuple, ...]
    tools: tuple[ToolSpec, ...]
    # The request's messages as received: a client re-sending an identical message (the usual
    # case) is matched by dict equality, without normalizing it again.
    raw: tuple[Message, ...] = ()


class ConversationTracker:
    def __init__(
        self,
        tokenizer: Any,
        *,
        session_id: str = "",
        trajectory: Trajectory | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        main_thread: MainThreadRule = "first",
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if main_thread not in ("first", "first_with_tools"):
            raise ValueError(f"main_thread must be 'first' or 'first_with_tools', not {main_thread!r}")
        self.main_thread = main_thread
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # a new segment's prompt is mostly the header every trial shares (see proxy.prefix_cache)
        self._prefix_cache = prefix_cache
        self.trajectory = trajectory if trajectory is not None else Trajectory(session_id=session_id)
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_text: str = tokenizer.eos_token
        self.eos_id: int = tokenizer.convert_tokens_to_ids(self.eos_text)
        # A tracker resumed over a recovered trajectory keeps its main thread, but not the
        # conversations: the next request of each thread opens a new segment.
        self._main_key: str | None = next(
            (s.system_key for s in self.trajectory.segments if s.kind == "main"), None
        )
        self._recorded: dict[int, _Recorded] = {}
        # Template locality per tail shape: absent = not probed yet (see _delta_text).
        self._tail_ok: dict[tuple, bool] = {}
        # (system texts, their system_key) of the last request
        self._last_system: tuple[tuple[str, ...] | None, str] = (None, "")

    # ------------------------------------------------------------------ rendering

    def _render(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None,
        *,
        generation: bool,
        thinking: bool | None = None,
    ) -> str:
        kwargs = dict(self.template_kwargs)
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation, **kwargs
        )

    def _encode(self, text: str) -> list[int]:
        # The Rust tokenizer directly when there is one: transformers' encode wraps it in a
        # batch call plus Python bookkeeping that costs ~0.1 ms per turn; the ids are the same
        # (tests/proxy/test_tokenization.py checks it).
        backend = self._backend
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ------------------------------------------------------------------ prepare

    def prepare(self, request: ChatRequest) -> PreparedTurn:
        """Decide segment and prompt ids for ``request`` (does not change any state).

        Raises ``proxy.errors.InvalidRequest`` for a request without messages.
        """
        messages = list(request.messages)
        if not messages:
            raise InvalidRequest("messages must not be empty", param="messages")
        tools = tuple(request.tools or ())
        # A coding agent's system prompt is tens of KB and the same every turn: comparing it
        # with the last one seen is a memcmp, hashing it again is not.
        texts = _system_texts(messages)
        if texts != self._last_system[0]:
            self._last_system = (texts, _hash_texts(texts))
        key = self._last_system[1]
        if self._main_key is None:
            kind: SegmentKind = "main" if self.main_thread == "first" or tools else "side"
        else:
            kind = "main" if key == self._main_key else "side"
        segs = self.trajectory.segments
        for idx in range(len(segs) - 1, -1, -1):
            seg = segs[idx]
            if seg.system_key != key or seg.kind != kind or idx not in self._recorded:
                continue
            ext = self._extension(idx, messages, tools, request.thinking)
            if ext is None:
                continue
            env, norms = ext
            # rule 5 holds by construction here; commit checks the backend's echo of it.
            prompt = seg.full_sequence
            prompt.extend(env)
            return PreparedTurn(idx, kind, key, prompt, env, len(seg), None, tuple(messages), tools, norms)
        text = self._render(messages, list(tools), generation=True, thinking=request.thinking)
        prompt = (
            self._prefix_cache.encode(text, self._encode)
            if self._prefix_cache is not None
            else id_array(self._encode(text))
        )
        rewritten = kind == "main" and any(s.kind == "main" for s in segs)
        header = SegmentHeader(kind=kind, rewritten=rewritten, system_key=key, prompt_ids=prompt)
        norms = tuple(_norm(m) for m in messages)
        return PreparedTurn(len(segs), kind, key, prompt, [], 0, header, tuple(messages), tools, norms)

    def _extension(
        self, idx: int, messages: list[Message], tools: tuple[ToolSpec, ...], thinking: bool | None
    ) -> tuple[list[int], tuple[tuple, ...]] | None:
        """(environment ids, normalized messages) extending segment ``idx`` to ``messages``, or
        None if it does not extend."""
        rec = self._recorded[idx]
        m = len(rec.norms)
        if rec.tools != tools or len(messages) < m:
            return None
        for i in range(m):
            if i < len(rec.raw) and messages[i] == rec.raw[i]:
                continue
            if not _same(rec.norms[i], _norm(messages[i])):
                return None
        norms = rec.norms + tuple(_norm(e) for e in messages[m:])
        delta = self._delta_text(messages, m, list(tools), thinking)
        if delta is None:
            return None
        env = self._encode(delta)
        seg = self.trajectory.segments[idx]
        last = seg.response_ids[-1] if seg.response_ids else seg.prompt_ids[-1]
        if last != self.eos_id:
            env = [self.eos_id] + env
        return env, norms

    def _delta_text(
        self, messages: list[Message], m: int, tools: list[ToolSpec], thinking: bool | None
    ) -> str | None:
        """Template text after the end of the last recorded assistant turn (rule 3), or None.

        Rendering the whole conversation twice per turn makes a turn's CPU grow with the session
        (~10x between turn 1 and turn 100 of a 64K-token session), and rendering the tool list
        (tens of KB of JSON schema for real scaffolds) costs more than the rest of the turn. For
        a *message-local* template (each message's text depends only on itself, its neighbours
        and the leading system messages) the text after the assistant's EOS is the same when
        only the leading system messages and the messages from the last assistant on are
        rendered, without the tool list (it lives in the header, before the cut). Whether that
        holds is probed against the full render once per *tail shape* (roles from the last
        assistant on, tool calls and reasoning present or not, thinking); a shape that fails its
        probe is always rendered in full, so exactness never depends on the shortcut.
        """
        shape = (_tail_shape(messages, m, thinking), bool(tools))
        ok = self._tail_ok.get(shape)
        if ok is False:
            return self._cut_after_eos(messages, m, tools, thinking)
        lead = 0
        while lead < m - 1 and messages[lead].get("role") == "system":
            lead += 1
        tail = messages[:lead] + messages[m - 1 :]
        fast = self._cut_after_eos(tail, lead + 1, [], thinking)
        if ok:
            return fast
        full = self._cut_after_eos(messages, m, tools, thinking)
        if full is not None:
            self._tail_ok[shape] = fast == full
        return full

    def _cut_after_eos(
        self, messages: list[Message], m: int, tools: list[ToolSpec], thinking: bool | None
    ) -> str | None:
        s_prev = self._render(messages[:m], tools, generation=False)
        s_full = self._render(messages, tools, generation=True, thinking=thinking)
        cut = s_prev.rfind(self.eos_text)
        if not s_full.startswith(s_prev) or cut == -1:
            return None
        return s_full[cut + len(self.eos_text) :]

    # ------------------------------------------------------------------ commit

    def commit(
        self,
        prepared: PreparedTurn,
        generation: Generation,
        parsed: ParsedOutput,
        info: TurnInfo = TurnInfo(),
    ) -> TurnRecord:
        """Record a successful generation for ``prepared`` and remember the returned message."""
        traj = self.trajectory
        if prepared.new_segment is not None:
            if prepared.segment_index != len(traj.segments):
                raise StalePreparedTurn(f"segment {prepared.segment_index} was opened by another turn")
        elif len(traj.segments[prepared.segment_index]) != prepared.base_len:
            raise StalePreparedTurn(f"segment {prepared.segment_index} grew since prepare")
        if generation.prompt_token_ids and not same_ids(generation.prompt_token_ids, prepared.prompt_ids):
            raise InvariantViolation("the backend reports a different prompt than the one prepared")
        record = TurnRecord(
            segment=prepared.segment_index,
            prompt_tokens=len(prepared.prompt_ids),
            completion_tokens=len(generation.token_ids),
            env_tokens_added=len(prepared.env_ids),
            finish_reason=generation.finish_reason,
            replica=generation.replica,
            latency_s=info.latency_s,
            tool_calls=len(parsed.tool_calls),
            parse_failures=parsed.parse_failures,
            resumed_after_abort=generation.resumed_after_abort,
            started_at=info.started_at,
            overlong=info.context_limited and generation.finish_reason == "length",
            source="replayed" if info.replayed else "generated",
            answer=info.answer,
        )
        traj.apply(
            TurnDelta(
                record=record,
                gen_ids=generation.token_ids,
                gen_logprobs=generation.logprobs,
                env_ids=prepared.env_ids,
                new_segment=prepared.new_segment,
                routed_experts=generation.routed_experts,
                policy_version=info.policy_version,
                policy_version_end=info.policy_version_end,
            )
        )
        if self._main_key is None and prepared.kind == "main":
            self._main_key = prepared.system_key
        norms = (
            prepared.norms
            if len(prepared.norms) == len(prepared.messages)
            else tuple(_norm(m) for m in prepared.messages)
        )
        self._recorded[prepared.segment_index] = _Recorded(
            (*norms, _norm(assistant_message(parsed))), prepared.tools, prepared.messages
        )
        return record

    def count_tokens(self, request: ChatRequest) -> int:
        """Tokens of the prompt that ``prepare(request)`` would send."""
        return len(self.prepare(request).prompt_ids)
