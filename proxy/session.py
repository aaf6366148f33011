"""Session: one trial attempt's conversation with the model, recorded token-exactly.

A turn: ``tracker.prepare`` (segment + prompt ids) -> clamp ``max_tokens`` to the context
left -> ``pool.generate`` -> ``parse_output`` -> ``tracker.commit`` -> checkpoint.
In replay mode (``SessionConfig.replay``, proxy.replay) a request whose prompt ids match the
record's next turn of its thread skips the context check and the replica: the recorded
generation is committed (``TurnRecord.source`` "replayed") and the recorded answer returned
byte for byte. The first request that does not match ends the replay: it and every later one
are generated, or refused with ``ReplayDiverged`` when ``replay_live`` is False.
Response and tool-call ids derive from ``SessionConfig.id_seed`` and the turn (proxy.ids).

Rules and edge cases:
- Turns are serialised by one ``asyncio.Lock`` per session. A request that arrives while
  another turn of the same session is running WAITS for it (FIFO) and then runs against
  the updated trajectory; it is never rejected with 409. Real scaffolds send side calls
  (title generation, quota checks) concurrently with the main loop, and a 409 would turn
  those into client-visible failures. A client that retries a request whose first copy is
  still running therefore gets its answer after the first copy has been recorded; the
  tracker sees the retry as a rewritten history and opens a new segment (documented in
  ``proxy.tokenization``).
- Sampling: temperature, top_p, top_k and seed come from the session config (the trainer
  decides how to sample, not the scaffold); the client's stop sequences are honoured; the
  client's ``max_tokens``, the config's ``max_tokens`` and the context left are all upper
  bounds (None = no bound from that side).
- ``max_tokens`` < 1 or an empty stop string: ``InvalidRequest`` (400) before anything runs
  (vLLM would reject them; that must not surface as a backend error).
- The limit of a turn is the smaller of the context window (``SessionConfig.max_context_tokens``,
  the replicas' ``max_model_len``) and, with ``max_response_tokens``, the turn's segment's first
  prompt plus that many tokens. This is how a trainer's sample budget is kept (verl trains
  ``rollout.prompt_length`` + ``rollout.response_length`` tokens per sample; the trial spec sets
  ``max_context_tokens`` to their sum and ``max_response_tokens`` to the latter): a segment is
  one sample, prompt + every token after it (the model's and the tool outputs that came back as
  later prompt tokens), and a turn's prompt is the whole segment so far, so the segment stays
  within the limit as long as every turn's prompt + max_tokens does. The first prompt counts
  in full: its part over ``prompt_length`` moves into verl's response (mask 0), which is why the
  total and the response each have a bound (both hold exactly when the segment's sample fits).
  A turn is refused only when its prompt alone leaves no token (prompt >= limit), never for the
  client's ``max_tokens``: that is capped at the limit - prompt (both protocols allow a shorter
  answer, ``stop_reason`` "max_tokens" / ``finish_reason`` "length"), and such a cut turn is
  ``overlong`` (``TurnRecord.overlong``).
- No context left (prompt >= the turn's limit): ``ContextExhausted`` (400),
  ``counters.overlong`` += 1 and ``overlong`` is set; nothing else is recorded. A prompt that
  certainly reaches the limit is refused so before it is encoded (``tracker.prepare``'s budget,
  proxy.tokenization rule 6), with its lower bound as N in "prompt is too long: N tokens": a
  body of several MiB over the context answers in milliseconds, not after seconds of encoding.
  Not in replay mode (a recorded turn skips the context check).
- ``SessionConfig.overlong_ends_session`` (trials with a token budget): once the trajectory is
  overlong (a turn refused or cut at its limit), every later *agent turn* (below) is refused
  with ``BudgetSpent`` (400) before anything is generated: the sample the trainer gets ends
  there, so nothing the agent does after it (compacting and going on in a new segment the
  trainer drops) may change the outcome its reward is graded on. Tool-less side calls are
  still served, as at the turn limit.
- Infrastructure is never the agent's to see while it can be helped: while no replica can
  serve a turn the pool HOLDS it (proxy.pool: up to ``outage_hold_s``, then it fails;
  streaming clients get keep-alive pings meanwhile) and ``counters.outage_holds`` += 1.
  A turn that still fails on the backend (past the hold, a 4xx from vLLM, aborts that cannot
  be resumed) is answered with its ``BackendError`` and counted in ``counters.infra_errors``.
  With ``SessionConfig.infra_ends_session`` (trial attempts: one that saw infrastructure is
  retried as such, activities.scaffold, so generating more of it would be waste) every later
  request then fails at once the same way (counted too). A session closed while its turn is
  held (the agent was stopped while it waited: a timeout) cancels the turn and counts it in
  ``infra_errors``.
- ``close()`` never waits out a generation: the agent that asked for it is gone (stopped at
  its timeout), and a slow turn (thousands of tokens from a busy replica) could outlast the
  activity that closes the session, turning the agent's timeout into a lost attempt. The
  running call is cancelled, which closes its connection to the replica (vLLM aborts a request
  whose client went away), the turn commits nothing and ``counters.closed_mid_turn`` += 1.
  Nothing of it is recorded: calls are non-streaming, so no token of an unfinished
  generation has reached the proxy, and the agent never saw any of it either; the trajectory
  ends with the last turn the agent was answered. A turn that reaches its call after
  ``close()`` began does not start one.
- A failed turn (backend error, parse of the request) commits nothing; what was recorded
  before stays. Tokens are recorded as soon as the backend returns, even if the client has
  gone away (the server runs the turn as its own task).
- Checkpoints: after every committed turn the sink gets ``trajectory.delta_since(mark)``
  with ``seq`` counting successful writes. A failing sink is logged and counted, the mark
  does not move, and the next turn's delta covers both turns: nothing is skipped.
  The write runs in the background, so the client has its answer without waiting for an
  S3 PUT; the session's next turn, ``flush_checkpoints()`` and ``close()`` wait for it, so
  writes never overlap and stay in order. (A crash in that window loses what a crash just
  before answering would have lost: the last turn, which the scaffold dies with too.)
- After ``close()`` every request answers ``NotFound``; ``close()`` waits for a running turn's
  preparation (rendering and encoding), never for its generation (above).
- Turn limit (``SessionConfig.max_turns``, for agents without a hard limit of their own): an
  *agent turn* is a turn on the main thread or one whose request offers tools (a sub-agent);
  tool-less side calls (titles, summaries) cannot act on the sandbox and do not count. Once
  ``max_turns`` agent turns are committed, every further request that would be one is
  refused with ``TurnLimitReached`` (400, which clients do not retry) before anything is
  generated, and ``counters.turn_limited`` += 1. Nothing is synthesized: the record ends
  with the model's last real turn. A request offering tools is refused before it waits for
  a running turn, so the refusal keeps its HTTP status instead of arriving inside a stream.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, NoReturn, TypeVar

from proxy import ids
from proxy.backend import CompletionRequest
from proxy.chat import ChatRequest, FinishReason, SamplingParams, TurnOutcome
from proxy.checkpoint import CheckpointSink
from proxy.errors import (
    BackendError,
    BudgetSpent,
    ContextExhausted,
    InvalidRequest,
    NotFound,
    ReplayDiverged,
    ReplicaUnreachable,
    TurnLimitReached,
)
from proxy.parsers import (
    HarmonyUnavailable,
    OutputDecoder,
    check_parsers,
    markup_of,
    parse_output,
    starts_inside_reasoning,
    strip_text_suffix,
    text_of,
)
from proxy.pool import ReplicaPool
from proxy.prefix_cache import PrefixCache
from proxy.profiles import ModelProfile
from proxy.replay import RecordedTurn, Replayer, ReplayRecord, answer_of
from proxy.tokenization import ConversationTracker, MainThreadRule, OverBudget, PreparedTurn, TurnInfo
from proxy.trajectory import Mark, Trajectory
from proxy.wire import MessageMemo

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)}
_MAIN_THREAD_RULES: dict[str, MainThreadRule] = {"first": "first", "first_with_tools": "first_with_tools"}
# Runs a synchronous step somewhere else (the server's worker thread) and awaits its result.
Offload = Callable[[Callable[[], Any]], Awaitable[Any]]
# How many prompt ids the reasoning parser looks at to tell whether the prompt opened thinking.
_PROMPT_TAIL = 16


@dataclass(frozen=True)
class SessionConfig:
    """Per-session settings. ``model`` is the served model name sent to vLLM.

    ``replicas`` non-empty gives the session its own pool (else the server's pool serves
    it). ``reasoning_parser``/``tool_parser`` None disable that parsing stage; ``"auto"`` (the
    default) takes the model profile's (proxy.profiles). ``profile`` overrides fields of the
    proxy's detected model profile for this session (e.g. ``{"stop_tokens": [...]}``).
    ``max_context_tokens`` None means the replicas' ``max_model_len``; a larger value than
    theirs is lowered to it (a prompt the backend cannot take must fail as
    ``ContextExhausted``, not as a backend 400).
    ``max_response_tokens`` None: no bound per segment; else a segment holds at most its first
    prompt plus that many tokens (module docstring). ``overlong_ends_session``: the first
    overlong turn ends the agent's turns (``BudgetSpent``; module docstring).
    ``infra_ends_session``: after a request failed on infrastructure every later one fails at
    once (module docstring).
    ``template_kwargs`` go to every chat-template render (e.g. ``enable_thinking``).
    ``max_turns`` None: no turn limit; else the agent turns the session serves (module docstring).
    """

    model: str = "default"
    sampling: SamplingParams = SamplingParams()
    max_context_tokens: int | None = None
    max_response_tokens: int | None = None
    overlong_ends_session: bool = False
    infra_ends_session: bool = False
    replicas: tuple[str, ...] = ()
    reasoning_parser: str | None = "auto"
    tool_parser: str | None = "auto"
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    profile: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointSink | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # Which call defines the main thread (see proxy.tokenization rule 1).
    main_thread: MainThreadRule = "first"
    # The trainer's global step whose weights the replicas serve (recorded per segment as the
    # policy-version range); None when unknown.
    policy_version: int | None = None
    # What the ids the proxy invents derive from (proxy.ids); None: the session id. Trial
    # sessions use the trial id, so every attempt of a trial makes the same ids.
    id_seed: str | None = None
    # An earlier attempt's record to answer from while requests match it (proxy.replay);
    # ``replay_live`` False: refuse what the record cannot answer (ReplayDiverged) instead of
    # generating it (a model-free replay).
    replay: ReplayRecord | None = None
    replay_live: bool = True
    max_turns: int | None = None

    def with_overrides(self, body: Any) -> SessionConfig:
        """This config updated from a ``POST /sessions`` JSON body. Raises ``ValueError``
        / ``TypeError`` for unknown keys or wrong types (answered 400)."""
        if not isinstance(body, dict):
            raise TypeError("session body must be a JSON object")
        unknown = set(body) - {
            "model",
            "sampling",
            "max_context_tokens",
            "max_response_tokens",
            "overlong_ends_session",
            "infra_ends_session",
            "replicas",
            "metadata",
            "reasoning_parser",
            "tool_parser",
            "template_kwargs",
            "main_thread",
            "policy_version",
            "id_seed",
            "profile",
            "max_turns",
        }
        if unknown:
            raise ValueError(f"unknown session fields: {sorted(unknown)}")
        out = self
        if "model" in body:
            out = replace(out, model=_typed(body["model"], str, "model"))
        if "sampling" in body:
            s = _typed(body["sampling"], dict, "sampling")
            if set(s) - _SAMPLING_KEYS:
                raise ValueError(f"unknown sampling fields: {sorted(set(s) - _SAMPLING_KEYS)}")
            if "stop" in s:
                s = {**s, "stop": tuple(_typed(s["stop"], list, "sampling.stop"))}
            for k in ("temperature", "top_p"):
                if k in s and (isinstance(s[k], bool) or not isinstance(s[k], (int, float))):
                    raise TypeError(f"sampling.{k} must be a number")
            for k in ("max_tokens", "top_k", "seed"):
                if s.get(k) is not None and (isinstance(s[k], bool) or not isinstance(s[k], int)):
                    raise TypeError(f"sampling.{k} must be an integer")
            out = replace(out, sampling=replace(out.sampling, **s))
        if "max_context_tokens" in body:
            out = replace(out, max_context_tokens=_positive(body, "max_context_tokens"))
        if "max_response_tokens" in body:
            out = replace(out, max_response_tokens=_positive(body, "max_response_tokens"))
        if "overlong_ends_session" in body:
            out = replace(
                out,
                overlong_ends_session=_typed(body["overlong_ends_session"], bool, "overlong_ends_session"),
            )
        if "infra_ends_session" in body:
            out = replace(
                out, infra_ends_session=_typed(body["infra_ends_session"], bool, "infra_ends_session")
            )
        if "replicas" in body:
            urls = _typed(body["replicas"], list, "replicas")
            out = replace(out, replicas=tuple(_typed(u, str, "replicas[]") for u in urls))
        if "metadata" in body:
            out = replace(out, metadata=_typed(body["metadata"], dict, "metadata"))
        if "template_kwargs" in body:
            out = replace(out, template_kwargs=_typed(body["template_kwargs"], dict, "template_kwargs"))
        if "reasoning_parser" in body:
            out = replace(out, reasoning_parser=_optional_name(body, "reasoning_parser"))
        if "tool_parser" in body:
            out = replace(out, tool_parser=_optional_name(body, "tool_parser"))
        if "profile" in body:
            overrides = _typed(body["profile"], dict, "profile")
            ModelProfile().with_overrides(overrides)  # field names and types, checked now (400)
            out = replace(out, profile=overrides)
        if "reasoning_parser" in body or "tool_parser" in body:
            try:
                check_parsers(*(None if v == "auto" else v for v in (out.reasoning_parser, out.tool_parser)))
            except (KeyError, ValueError, HarmonyUnavailable) as exc:
                raise ValueError(exc.args[0]) from None
        if "main_thread" in body:
            rule = _MAIN_THREAD_RULES.get(_typed(body["main_thread"], str, "main_thread"))
            if rule is None:
                raise ValueError("main_thread must be 'first' or 'first_with_tools'")
            out = replace(out, main_thread=rule)
        if "policy_version" in body:
            v = body["policy_version"]
            out = replace(out, policy_version=None if v is None else _typed(v, int, "policy_version"))
        if "id_seed" in body:
            v = body["id_seed"]
            out = replace(out, id_seed=None if v is None else _typed(v, str, "id_seed"))
        if "max_turns" in body:
            v = body["max_turns"]
            if v is not None and _typed(v, int, "max_turns") < 1:
                raise ValueError("max_turns must be at least 1")
            out = replace(out, max_turns=v)
        return out


def _typed(value: object, kind: type[_T], name: str) -> _T:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise TypeError(f"{name} must be of type {kind.__name__}")
    return value


def _positive(body: Mapping[str, Any], key: str) -> int:
    """``body[key]`` as a positive integer."""
    n = _typed(body[key], int, key)
    if n <= 0:
        raise ValueError(f"{key} must be positive")
    return n


def _optional_name(body: Mapping[str, Any], key: str) -> str | None:
    """``body[key]`` as a name (a string) or None."""
    return None if body[key] is None else _typed(body[key], str, key)


@dataclass(frozen=True)
class SessionStats:
    """A session's live counters (`Session.stats()`; `GET /sessions/{id}` answers them as a
    JSON object with these keys). Token counts sum every turn's whole prompt and output."""

    session_id: str
    turns: int
    segments: int
    prompt_tokens: int
    completion_tokens: int
    counters: dict[str, Any]  # the trajectory's counters (`TrajectoryCounters`)
    overlong: bool
    busy: bool
    closed: bool
    checkpoints_written: int
    checkpoint_failures: int
    replayed_turns: int
    metadata: dict[str, Any]


class Session:
    """One trial attempt. Created by ``ProxyServer.open_session``; see module docstring."""

    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        tokenizer: Any,
        pool: ReplicaPool,
        *,
        prefix_cache: PrefixCache | None = None,
        profile: ModelProfile | None = None,
    ) -> None:
        """``profile`` is the proxy's detected model profile (None: detected from ``tokenizer``);
        ``config.profile`` is applied on top. Unknown parser names raise ``KeyError``."""
        self.id = session_id
        self.config = config
        self.pool = pool
        self.tokenizer = tokenizer
        # The weights version the replicas serve now; a weight sync moves it (set_policy_version),
        # and a turn running across the change records both ends.
        self.policy_version: int | None = config.policy_version
        self.tracker = ConversationTracker(
            tokenizer,
            session_id=session_id,
            template_kwargs=config.template_kwargs,
            main_thread=config.main_thread,
            prefix_cache=prefix_cache,
            profile=profile.with_overrides(config.profile) if profile is not None else None,
        )
        if profile is None and config.profile:
            self.tracker.profile = self.tracker.profile.with_overrides(config.profile)
        self.profile = self.tracker.profile
        self.reasoning_parser = (
            self.profile.reasoning_parser if config.reasoning_parser == "auto" else config.reasoning_parser
        )
        self.tool_parser = self.profile.tool_parser if config.tool_parser == "auto" else config.tool_parser
        self.tracker.trajectory.metadata.update(config.metadata)
        self.overlong = False
        self.closed = False
        self.checkpoints_written = 0
        self.checkpoint_failures = 0
        self.agent_turns = 0  # committed turns that count toward ``config.max_turns``
        self._mark = Mark.EMPTY
        self._lock = asyncio.Lock()
        self._pending_checkpoint: asyncio.Task[None] | None = None
        # the running turn's backend call (close cancels it), whether the pool holds it for an
        # outage, and whether close began (module docstring)
        self._in_flight: asyncio.Future[Any] | None = None
        self._held = False
        self._closing = False
        self._ignored_logged: set[str] = set()
        # The history messages this session's requests carried, converted (the adapters take
        # it, so a resent history is validated only where it is new)
        self.message_memo = MessageMemo()
        self.id_seed = config.id_seed or session_id
        self.replayer = Replayer(config.replay, live=config.replay_live) if config.replay else None
        # turn numbers whose ids are taken (by replayed answers or live turns); see _id_turn
        self._id_turns_used: set[int] = set()
        self._replay_end_logged = False
        if self.replayer is not None:
            self._note_replay_status()
        # Make the parsers once now, so a missing dependency (harmony's vocabulary) fails at
        # session creation, not mid-trial.
        check_parsers(self.reasoning_parser, self.tool_parser)
        # Markup tokens stay apart from text (proxy.parsers._pieces): GLM and harmony markup is
        # special, so a decode skipping special tokens would hide it from the parsers.
        self._decoder = OutputDecoder(tokenizer, markup_of(self.reasoning_parser, self.tool_parser))

    @property
    def trajectory(self) -> Trajectory:
        return self.tracker.trajectory

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def note_ignored(self, names: tuple[str, ...]) -> None:
        """Log request fields the proxy does not act on, once per field per session."""
        new = set(names) - self._ignored_logged
        if new:
            self._ignored_logged |= new
            log.info("session %s: ignoring request fields %s", self.id, sorted(new))

    def set_policy_version(self, version: int) -> None:
        """The replicas now serve weights ``version`` (e.g. after a weight sync); turns from
        now on, and a turn running right now, record it in their segment's version range."""
        self.policy_version = version

    def count_tokens(self, request: ChatRequest) -> int:
        if self.closed:
            raise NotFound("unknown session")
        return self.tracker.count_tokens(request)

    async def run_turn(
        self,
        request: ChatRequest,
        *,
        new_tool_call_id: Callable[[], str] | None = None,
        offload: Offload | None = None,
    ) -> TurnOutcome:
        """Generate (or replay) and record one turn. Raises ``ProxyError`` subclasses (module
        docstring). ``new_tool_call_id`` None: tool-call ids derive from the session's id seed
        and the turn (``proxy.ids``), as the response id always does. ``offload`` runs the
        turn's preparation (render and encode: seconds for a request of several MiB) off the
        event loop, e.g. in a worker thread; None runs it inline."""
        _check_sampling(request.sampling)
        if self.config.infra_ends_session and self.trajectory.counters.infra_errors and not self.closed:
            self.trajectory.note_infra_error()
            raise ReplicaUnreachable(
                "an earlier turn of this attempt failed on infrastructure; it is retried"
            )
        if request.tools and not self.closed:
            self._check_turn_limit(counts=True)  # spent limits never come back: no need to wait
        async with self._lock:
            if self.closed:
                raise NotFound("unknown session")
            await self._wait_checkpoint()
            # the context check before the encode (module docstring); None: no limit known yet
            budget = await self.context_limit() if self.replayer is None else None
            prepare = functools.partial(self.tracker.prepare, request, budget)
            try:
                prepared = prepare() if offload is None else await offload(prepare)
            except OverBudget as over:
                self._check_turn_limit(over.kind == "main" or bool(request.tools))
                assert budget is not None
                self._refuse_overlong(over.at_least, budget)
            counts = prepared.kind == "main" or bool(request.tools)
            self._check_turn_limit(counts)
            turn = len(self.trajectory.turns)
            if self.replayer is not None:
                recorded = self.replayer.take(prepared, turn, request.protocol)
                if recorded is not None:
                    outcome = self._commit_replayed(prepared, recorded)
                    self._after_commit(counts)
                    return outcome
                self._note_replay_end()
            outcome = await self._generate(prepared, request, turn, new_tool_call_id)
            self._after_commit(counts)
        return outcome

    def _refuse_overlong(self, prompt_tokens: int, limit: int) -> NoReturn:
        """The prompt leaves no room to generate: note it and refuse (module docstring)."""
        self.trajectory.note_overlong()
        self.overlong = True
        raise ContextExhausted(prompt_tokens, limit)

    def _check_turn_limit(self, counts: bool) -> None:
        """Refuse an agent turn (``counts``) once ``config.max_turns`` of them are committed, or
        once the trajectory is overlong in a session that ends there (module docstring)."""
        if not counts:
            return
        limit = self.config.max_turns
        if limit is not None and self.agent_turns >= limit:
            self.trajectory.note_turn_limited()
            raise TurnLimitReached(limit)
        if self.config.overlong_ends_session and self.trajectory.counters.overlong:
            raise BudgetSpent(self.config.max_context_tokens)

    def _segment_limit(self, prepared: PreparedTurn, context: int) -> int:
        """The turn's limit: ``context``, or less where ``max_response_tokens`` bounds the
        segment to its first prompt plus that many tokens (module docstring)."""
        per_segment = self.config.max_response_tokens
        if per_segment is None:
            return context
        if prepared.extends:
            first = len(self.trajectory.segments[prepared.segment_index].prompt_ids)
        else:
            first = len(prepared.prompt_ids)
        return min(context, first + per_segment)

    async def _generate(
        self,
        prepared: PreparedTurn,
        request: ChatRequest,
        turn: int,
        new_tool_call_id: Callable[[], str] | None,
    ) -> TurnOutcome:
        prompt_len = len(prepared.prompt_ids)
        limit = self._segment_limit(prepared, await self._context_limit())
        left = limit - prompt_len
        if left <= 0:
            self._refuse_overlong(prompt_len, limit)
        bounds = (request.sampling.max_tokens, self.config.sampling.max_tokens, left)
        max_tokens = min(b for b in bounds if b is not None)
        sampling = replace(self.config.sampling, stop=request.sampling.stop)
        started = time.time()
        version_at_start = self.policy_version
        req = CompletionRequest(
            model=self.config.model, prompt_ids=prepared.prompt_ids, max_tokens=max_tokens, sampling=sampling
        )
        gen = await self._infra_call(lambda on_hold: self.pool.generate(self.id, req, on_hold=on_hold))
        pieces = self._decoder.decode(gen.token_ids)
        ended_on_eos = bool(gen.token_ids) and gen.token_ids[-1] in self.tracker.stop_ids
        stop_sequence = None
        if gen.finish_reason == "stop" and not ended_on_eos:
            stop_sequence = _matched_stop(text_of(pieces), sampling.stop)
        if stop_sequence:
            # vLLM includes the stop string (the record keeps it); clients must not see it.
            pieces = strip_text_suffix(pieces, stop_sequence)
        id_turn = self._id_turn(turn)
        new_tool_call_id = new_tool_call_id or ids.tool_call_ids(request.protocol, self.id_seed, id_turn)
        parsed = parse_output(
            pieces,
            reasoning=self.reasoning_parser,
            tools=self.tool_parser,
            tool_call_id_factory=new_tool_call_id,
            tool_specs=request.tools,
            started_inside_reasoning=starts_inside_reasoning(
                self._decoder.decode(prepared.prompt_ids[-_PROMPT_TAIL:]), self.reasoning_parser
            ),
        )
        finish: FinishReason = (
            "tool_calls" if parsed.tool_calls and gen.finish_reason == "stop" else gen.finish_reason
        )
        outcome = TurnOutcome(
            parsed,
            finish,
            prompt_len,
            len(gen.token_ids),
            stop_sequence=stop_sequence,
            response_id=ids.response_id(request.protocol, self.id_seed, id_turn),
            created=int(started),
        )
        self.tracker.commit(
            prepared,
            gen,
            parsed,
            TurnInfo(
                started_at=started,
                latency_s=time.time() - started,
                policy_version=version_at_start,
                policy_version_end=self.policy_version,
                # only a turn cut by the context window (not by the client's max_tokens) is overlong
                context_limited=max_tokens == left,
                answer=answer_of(outcome, request.protocol),
            ),
        )
        return outcome

    async def _infra_call(self, make: Callable[[Callable[[], None]], Awaitable[_T]]) -> _T:
        """``make(on_hold)`` (a pool call): a failure is counted as infrastructure the agent saw;
        ``close`` cancels the call, counted as infrastructure when the pool held it for an
        outage (it calls ``on_hold``), else as a turn cut by the close (module docstring)."""
        if self._closing:
            self.trajectory.note_closed_mid_turn()
            raise NotFound("the session closed before its turn was generated")

        def on_hold() -> None:
            self.trajectory.note_outage_hold()
            self._held = True

        call = asyncio.ensure_future(make(on_hold))
        self._in_flight = call
        try:
            return await asyncio.shield(call)
        except BackendError:
            self.trajectory.note_infra_error()
            raise
        except asyncio.CancelledError:
            if not self._closing:  # the turn itself was cancelled, not by close
                call.cancel()
                raise
            if self._held:
                self.trajectory.note_infra_error()
                raise ReplicaUnreachable("the session closed while its turn waited for a replica") from None
            self.trajectory.note_closed_mid_turn()
            raise NotFound("the session closed while its turn was generating") from None
        finally:
            self._in_flight, self._held = None, False

    def _commit_replayed(self, prepared: PreparedTurn, recorded: RecordedTurn) -> TurnOutcome:
        """Record ``recorded``'s generation for ``prepared`` without a replica; the answer is
        the recorded one, byte for byte."""
        outcome = recorded.outcome()
        started = time.time()
        self.tracker.commit(
            prepared,
            recorded.generation,
            outcome.parsed,
            TurnInfo(
                started_at=started,
                latency_s=time.time() - started,
                policy_version=recorded.policy_versions[0],
                policy_version_end=recorded.policy_versions[1],
                context_limited=recorded.record.overlong,
                answer=recorded.answer,
                replayed=True,
            ),
        )
        self._id_turns_used.add(recorded.index)
        self._note_replay_status()
        return outcome

    def _id_turn(self, turn: int) -> int:
        """The turn number live ids derive from: ``turn``, unless a replayed answer (whose ids
        came from its recorded turn number) already used it; then the next free one."""
        while turn in self._id_turns_used:
            turn += 1
        self._id_turns_used.add(turn)
        return turn

    def _note_replay_status(self) -> None:
        assert self.replayer is not None
        self.trajectory.metadata["replay"] = self.replayer.status()

    def _note_replay_end(self) -> None:
        """The request at hand is not in the record: log where the replay stopped, once, and
        refuse it when this session has no replicas to go on with."""
        replayer = self.replayer
        assert replayer is not None
        div = replayer.divergence
        if not self._replay_end_logged and div is not None:
            self._replay_end_logged = True
            self._note_replay_status()
            log.info(
                "session %s: replay stopped at request %d (%s) after %d replayed turns; %s",
                self.id,
                div.turn,
                div.reason,
                replayer.replayed,
                "generating live" if replayer.live else "no replicas: refusing",
            )
        if not replayer.live:
            what = div.reason if div is not None else "replay ended"
            raise ReplayDiverged(f"request {len(self.trajectory.turns)}: {what}")

    def _after_commit(self, counts: bool) -> None:
        self.agent_turns += counts
        if self.config.checkpoint is not None:
            self._pending_checkpoint = asyncio.create_task(self._checkpoint())

    async def context_limit(self) -> int | None:
        """The session's context window (``SessionConfig.max_context_tokens``, the replicas'
        ``max_model_len``: the smaller); None when neither the config nor any replica says
        (never waits for one)."""
        limits = [
            n for n in (self.config.max_context_tokens, await self.pool.context_limit()) if n is not None
        ]
        return min(limits) if limits else None

    async def _context_limit(self) -> int:
        """``context_limit`` for a turn: when only the replicas can say and none does (an
        outage at the first turn), the turn is held for one (module docstring)."""
        limit = await self.context_limit()
        if limit is not None:
            return limit

        async def held(on_hold: Callable[[], None]) -> int:
            on_hold()
            n = await self.pool.context_limit(hold=True)
            if n is None:
                raise ReplicaUnreachable(
                    "no replica reports max_model_len and the session sets no max_context_tokens"
                )
            return n

        return await self._infra_call(held)

    async def _wait_checkpoint(self) -> None:
        """Wait for the background checkpoint write of the last turn, if any (never raises:
        ``_checkpoint`` handles sink failures itself)."""
        if self._pending_checkpoint is not None:
            await asyncio.shield(self._pending_checkpoint)
            self._pending_checkpoint = None

    async def flush_checkpoints(self) -> None:
        """Return once every committed turn's checkpoint write has finished (or failed)."""
        async with self._lock:
            await self._wait_checkpoint()

    async def _checkpoint(self) -> None:
        sink = self.config.checkpoint
        if sink is None:
            return
        mark = self.trajectory.mark()
        try:
            await sink.write(self.id, self.checkpoints_written, self.trajectory.delta_since(self._mark))
        except Exception:  # noqa: BLE001 - the turn is recorded; the next delta covers it
            self.checkpoint_failures += 1
            log.exception("session %s: checkpoint %d failed", self.id, self.checkpoints_written)
            return
        self._mark = mark
        self.checkpoints_written += 1

    async def close(self) -> Trajectory:
        """Cancel a running turn's generation (held or not: module docstring), flush a pending
        checkpoint, refuse further requests."""
        self._closing = True
        if self._in_flight is not None:
            self._in_flight.cancel()
        async with self._lock:
            self.closed = True
            await self._wait_checkpoint()
            if self._mark != self.trajectory.mark():
                await self._checkpoint()
        self.pool.forget(self.id)
        return self.trajectory

    def stats(self) -> SessionStats:
        t = self.trajectory
        return SessionStats(
            session_id=self.id,
            turns=t.counters.turns,
            segments=len(t.segments),
            prompt_tokens=sum(r.prompt_tokens for r in t.turns),
            completion_tokens=sum(r.completion_tokens for r in t.turns),
            counters=asdict(t.counters),
            overlong=self.overlong,
            busy=self.busy,
            closed=self.closed,
            checkpoints_written=self.checkpoints_written,
            checkpoint_failures=self.checkpoint_failures,
            replayed_turns=t.counters.replayed,
            metadata=dict(t.metadata),
        )

    @staticmethod
    def summary(t: Trajectory) -> dict[str, Any]:
        """JSON summary of a trajectory (no token arrays)."""
        return {
            "session_id": t.session_id,
            "metadata": dict(t.metadata),
            "counters": asdict(t.counters),
            "segments": [
                {
                    "kind": s.kind,
                    "rewritten": s.rewritten,
                    "prompt_tokens": len(s.prompt_ids),
                    "response_tokens": len(s.response_ids),
                    "generated_tokens": sum(s.response_mask),
                }
                for s in t.segments
            ],
            "turns": [asdict(r) for r in t.turns],
        }


def _check_sampling(s: SamplingParams) -> None:
    """Reject what vLLM would answer 400 to, so it is the client's 400, not a backend 502."""
    if s.max_tokens is not None and s.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {s.max_tokens}", param="max_tokens")
    if any(not stop for stop in s.stop):
        raise InvalidRequest("stop sequences must be non-empty strings", param="stop")


def _matched_stop(text: str, stops: tuple[str, ...]) -> str | None:
    return next((s for s in stops if s and text.endswith(s)), None)
