"""The token-exact trajectory of one session, its accounting fold and compact serialization.

Public API:

    Segment        one token sequence: prompt_ids + response_ids (mask/logprobs per response token)
    TurnRecord     what happened in one generation turn (counts, timing, replica, finish reason)
    TurnDelta      everything one turn adds; the only way a trajectory changes (besides notes)
    Counters       turns, tool_calls, parse_failures, overlong, aborts_resumed, replayed, turn_limited,
                   infra_errors, outage_holds
    Mark           a position in a trajectory's history, for incremental checkpoints
    Trajectory
        .apply(delta: TurnDelta) -> TurnRecord      the fold step (in-memory mutation, no I/O)
        .note_overlong() -> None                     a request rejected as too long (no tokens)
        .note_turn_limited() -> None                 a request refused at the turn limit (no tokens)
        .note_infra_error() / .note_outage_hold()    the agent saw infrastructure fail / a turn held
        .mark() -> Mark                              position to take the next delta from
        .delta_since(mark: Mark) -> bytes            npz with only what changed after ``mark``
        .to_bytes() -> bytes                         == delta_since(Mark.EMPTY)
        .apply_checkpoint(payload: bytes) -> None    apply one delta (must continue this state)
        Trajectory.from_bytes(payload) / Trajectory.from_checkpoints([payload, ...])
    experts_sentinel(dtype) -> int, FORMAT_VERSION
    IDS_CODE, MASK_CODE, LOGPROBS_CODE   array typecodes of Segment's token arrays ('i', 'b', 'f')
    id_array(ids) -> array('i'); same_ids(a, b) -> bool   (lists, tuples, arrays alike)
    TrajectoryError (ValueError), CheckpointGapError (TrajectoryError)

Accounting is a fold: ``Trajectory.apply`` mutates the trajectory in memory only (no I/O,
no clock, no randomness), so replaying the same deltas always gives the same trajectory.
It validates the delta (lengths, segment index, experts rows) and raises ``TrajectoryError``
before touching anything, so a rejected delta leaves the trajectory unchanged.

Token layout of a segment: ``prompt_ids`` is the segment's first prompt; every later turn that
extends the segment appends its environment tokens (new messages + template text, mask 0,
logprob 0.0) and then the generated tokens (mask 1, vLLM's logprobs) to ``response_ids``.

In memory the four token sequences are growable typed arrays (stdlib ``array.array``): ids
int32 ('i'), mask int8 ('b'), logprobs float32 ('f'); 9 bytes per response token instead of
~70 for lists of Python ints/floats, which is what an open session mostly holds. They index,
slice, iterate and ``len`` like lists, but ``array == list`` is always False: compare with
``.tolist()``. ``Segment.full_ids`` is a plain ``list[int]`` (for JSON request bodies).
Logprobs are stored as float32 (what vLLM computes and what the trainer consumes), so
values are rounded to float32 on ``apply`` and round-trip exactly. A token id outside int32
is rejected by ``apply`` (``TrajectoryError``; real vocabularies are < 2**31).

Routed experts (R3): per segment either None (dense model, or never reported) or an integer
array [len(prompt_ids) + len(response_ids), layers, top_k] aligned with the full sequence.
vLLM reports [n - 1, layers, top_k] for a forward over n = prompt + generated tokens (the last
sampled token is never fed back), so each turn overwrites rows 0..n-2 with the turn's report
(the latest routing of every position) and the last row holds the sentinel "unknown".
A turn without experts on a segment that has some appends sentinel rows. dtype is uint8
(sentinel 255) while every expert id is < 255, else int16 (sentinel -1); a later upgrade to
int16 converts the earlier rows and their sentinels.

Counters: ``turns`` and ``tool_calls``/``parse_failures``/``aborts_resumed``/``replayed`` are sums
over turn records; ``overlong`` counts turns whose record says ``overlong`` (generation cut by the context
window, which only the session knows) plus ``note_overlong`` calls (prompt too long, nothing
generated). A turn cut by the client's own ``max_tokens`` is not overlong. ``turn_limited``
counts requests the session refused at its turn limit (``note_turn_limited``; nothing generated).

Serialization: an ``np.savez_compressed`` archive with int32 ids, uint8 masks, float32
logprobs, the experts rows, and one ``meta`` entry (UTF-8 JSON as uint8) holding session id,
metadata, counters, new turn records and per-segment headers. A checkpoint delta holds only
new segments, appended tokens, changed expert rows and new turn records (metadata and
counters in full; they are small), and records the state it continues from, so applying a
delta to the wrong state raises ``CheckpointGapError`` instead of silently corrupting.
Payloads written before a field existed still load (every later field has a default; the
fixtures in tests/proxy/fixtures/trajectory_format1 pin that).

Replay (proxy.replay): turn ``t``'s prompt is ``segments[t.segment].full_ids[:t.prompt_tokens]``
and its generated ids/logprobs follow it (``completion_tokens`` of them); with ``answer`` that
is all a later attempt needs to answer the same request without a replica.
"""

from __future__ import annotations

import io
import json
import zipfile
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from proxy.chat import FinishReason

SegmentKind = Literal["main", "side"]
TurnSource = Literal["generated", "replayed"]
SegmentCause = Literal["client", "template"]
FORMAT_VERSION = 1


_BAD_PAYLOAD = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)

# array.array typecodes of Segment's token sequences, and the numpy dtype of each in memory.
# 'i' is C int and 'f' C float: 4 bytes on every platform CPython supports, checked below so
# the int32/float32 npz arrays are these arrays' bytes.
IDS_CODE, MASK_CODE, LOGPROBS_CODE = "i", "b", "f"
_NP_DTYPE: dict[str, np.dtype] = {
    IDS_CODE: np.dtype(np.int32),
    MASK_CODE: np.dtype(np.int8),
    LOGPROBS_CODE: np.dtype(np.float32),
}
for _code, _dtype in _NP_DTYPE.items():
    if array(_code).itemsize != _dtype.itemsize:
        raise ImportError(
            f"array typecode {_code!r} is {array(_code).itemsize} bytes, need {_dtype.itemsize}"
        )


class TrajectoryError(ValueError):
    """A delta or payload that does not fit the trajectory (the trajectory is left unchanged)."""


class CheckpointGapError(TrajectoryError):
    """A checkpoint delta does not continue the state it is applied to (missing or reordered)."""


def experts_sentinel(dtype: np.dtype | type) -> int:
    """The "unknown experts" value for an experts array of ``dtype`` (uint8 or int16)."""
    return 255 if np.dtype(dtype) == np.uint8 else -1


def _experts_dtype(max_id: int) -> np.dtype:
    return np.dtype(np.uint8) if max_id < 255 else np.dtype(np.int16)


def _as_experts(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast ``arr`` (our dtype or vLLM's int32) to ``dtype``, keeping sentinels as sentinels."""
    if arr.dtype == dtype:
        return arr
    if arr.dtype == np.uint8:  # uint8 -> int16 upgrade: 255 meant unknown
        out = arr.astype(dtype)
        out[arr == 255] = experts_sentinel(dtype)
        return out
    return arr.astype(dtype)


def _typed(code: str, values: Iterable[Any]) -> array:
    """``values`` as an array of ``code`` (an array of that code is kept, not copied).

    Raises OverflowError (id outside int32) or TypeError (not numbers) like ``array`` does.
    """
    if isinstance(values, array) and values.typecode == code:
        return values
    if isinstance(values, np.ndarray):  # bulk copy instead of one Python number per element
        if (
            code == IDS_CODE
            and values.size
            and (values.dtype.kind not in "iu" or values.min() < -(2**31) or values.max() >= 2**31)
        ):
            raise OverflowError(f"ids of dtype {values.dtype} outside int32")
        out = array(code)
        out.frombytes(np.ascontiguousarray(values, dtype=_NP_DTYPE[code]).tobytes())
        return out
    return array(code, values)


def id_array(ids: Iterable[Any]) -> array:
    """``ids`` as an 'i' array (kept if it already is one). OverflowError outside int32."""
    return _typed(IDS_CODE, ids)


def same_ids(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two token sequences hold the same ids, whatever their types (``array == list``
    is always False, so never compare across types with ``==``). Ids outside int32 never
    match an array."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    if type(a) is type(b):
        return a == b
    try:
        return id_array(a) == id_array(b)
    except (OverflowError, TypeError):
        return False


def _filled(code: str, value: int, n: int) -> array:
    """``n`` copies of ``value`` (0 or 1) as an array of ``code``."""
    return array(code, bytes(n * array(code).itemsize)) if value == 0 else array(code, [value]) * n


@dataclass
class Segment:
    """One token sequence. ``full_ids`` = prompt_ids + response_ids is what the model saw.

    The token sequences are typed arrays (see the module docstring); any sequence of numbers
    passed to the constructor is converted (an array of the right typecode is kept as is).
    """

    kind: SegmentKind
    rewritten: bool
    system_key: str
    prompt_ids: array  # 'i' (int32)
    response_ids: array = field(default_factory=lambda: array(IDS_CODE))  # 'i' (int32)
    response_mask: array = field(default_factory=lambda: array(MASK_CODE))  # 'b' (int8, 0/1)
    response_logprobs: array = field(default_factory=lambda: array(LOGPROBS_CODE))  # 'f' (float32)
    routed_experts: np.ndarray | None = None
    policy_version_min: int | None = None
    policy_version_max: int | None = None
    # Why it opened while its thread had one (SegmentHeader.cause); None: its thread's first,
    # or a record written before segments kept it.
    cause: SegmentCause | None = None
    # (turn index, first experts row that changed) per turn applied; lets deltas carry only
    # the rows that changed.
    experts_writes: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.prompt_ids = _typed(IDS_CODE, self.prompt_ids)
        self.response_ids = _typed(IDS_CODE, self.response_ids)
        self.response_mask = _typed(MASK_CODE, self.response_mask)
        self.response_logprobs = _typed(LOGPROBS_CODE, self.response_logprobs)

    @property
    def full_ids(self) -> list[int]:
        """prompt_ids + response_ids as a new plain list (JSON encoders take no arrays)."""
        return self.full_sequence.tolist()

    @property
    def full_sequence(self) -> array:
        """prompt_ids + response_ids as a new 'i' array: a memcpy, where ``full_ids`` makes one
        int object per token (the proxy builds each extension prompt from this)."""
        return self.prompt_ids + self.response_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class TurnRecord:
    """One generation turn. ``env_tokens_added`` counts mask-0 tokens appended before it."""

    segment: int
    prompt_tokens: int
    completion_tokens: int
    env_tokens_added: int
    finish_reason: FinishReason
    replica: str = ""
    latency_s: float = 0.0
    tool_calls: int = 0
    parse_failures: int = 0
    resumed_after_abort: int = 0
    started_at: float = 0.0
    overlong: bool = False  # cut by the context window (not by the client's max_tokens)
    # "generated" by a replica, or "replayed" from an earlier attempt's record (proxy.replay)
    source: TurnSource = "generated"
    # The answer exactly as the client received it (``proxy.replay.answer_of``): protocol,
    # response id, created, content, reasoning, tool calls with their ids, finish reason,
    # stop sequence. None in records written before replay existed (they replay nothing).
    answer: dict[str, Any] | None = None
    # The weights versions the turn ran under, at its start and at its end (they differ when a
    # weight sync came while it generated); both widen its segment's range. None: unknown, or
    # a record written before turns carried them (its segment's range stands for it).
    policy_version: int | None = None
    policy_version_end: int | None = None


@dataclass(frozen=True)
class SegmentHeader:
    """What opens a new segment (its first prompt and routing identity)."""

    kind: SegmentKind
    rewritten: bool
    system_key: str
    prompt_ids: Sequence[int]
    # Why a segment opened while its thread had one: "client" (the conversation changed) or
    # "template" (it still matched, but the chat template forced a new render); None otherwise.
    cause: SegmentCause | None = None


@dataclass(frozen=True)
class TurnDelta:
    """Everything one turn adds to a trajectory.

    ``new_segment`` set: the turn opens segment ``record.segment`` (== len(segments)) with that
    header; ``env_ids`` must then be empty. Otherwise the turn extends segment
    ``record.segment``: ``env_ids`` (mask 0) then ``gen_ids`` (mask 1) are appended.
    ``routed_experts`` is vLLM's report for this forward, [len(segment after env) + len(gen) - 1,
    layers, top_k], or None.
    """

    record: TurnRecord
    gen_ids: Sequence[int]
    gen_logprobs: Sequence[float]
    env_ids: Sequence[int] = ()
    new_segment: SegmentHeader | None = None
    routed_experts: np.ndarray | None = None


@dataclass
class Counters:
    turns: int = 0
    tool_calls: int = 0
    parse_failures: int = 0
    overlong: int = 0
    aborts_resumed: int = 0
    replayed: int = 0  # turns answered from an earlier attempt's record, not by a replica
    # New segments forced by the client rewriting its history (compaction, edits) vs by the chat
    # template (the conversation continued, but its render could not extend the segment).
    rewrites_client: int = 0
    rewrites_template: int = 0
    turn_limited: int = 0  # requests refused at the session's turn limit (nothing generated)
    # Requests answered with an infrastructure error (no replica could serve them within the
    # pool's hold, or a backend failure), and requests still held when the session closed:
    # the agent saw infrastructure, so the attempt is no evidence about the model.
    infra_errors: int = 0
    outage_holds: int = 0  # turns the pool held while no replica could serve them
    # Turns whose generation was cancelled because the session closed (the agent was stopped,
    # its timeout): nothing of them is recorded (proxy.session)
    closed_mid_turn: int = 0


@dataclass(frozen=True)
class Mark:
    """A trajectory position: turn count, response length per segment, overlong notes."""

    turns: int
    response_lens: tuple[int, ...]

    EMPTY: ClassVar[Mark]


Mark.EMPTY = Mark(0, ())


@dataclass
class Trajectory:
    session_id: str
    metadata: dict[str, Any] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)

    # ------------------------------------------------------------------ fold

    def apply(self, delta: TurnDelta) -> TurnRecord:
        """Apply one turn (validated first; on error nothing changes). Returns the record."""
        rec = delta.record
        if len(delta.gen_ids) != len(delta.gen_logprobs):
            raise TrajectoryError(
                f"{len(delta.gen_ids)} generated ids but {len(delta.gen_logprobs)} logprobs"
            )
        # Typed copies first: an id outside int32 is rejected before anything changes. The
        # prompt is always copied (the header's array, if it is one, stays the caller's).
        try:
            env_ids = _typed(IDS_CODE, delta.env_ids)
            gen_ids = _typed(IDS_CODE, delta.gen_ids)
            gen_logprobs = _typed(LOGPROBS_CODE, delta.gen_logprobs)
            prompt_ids = array(
                IDS_CODE, delta.new_segment.prompt_ids if delta.new_segment is not None else ()
            )
        except (OverflowError, TypeError) as exc:
            raise TrajectoryError(f"token ids must be int32 and logprobs numbers: {exc}") from exc
        if delta.new_segment is not None:
            if rec.segment != len(self.segments):
                raise TrajectoryError(f"new segment must get index {len(self.segments)}, got {rec.segment}")
            if env_ids:
                raise TrajectoryError("a new segment's turn has no environment delta")
            h = delta.new_segment
            seg = Segment(
                kind=h.kind,
                rewritten=h.rewritten,
                system_key=h.system_key,
                prompt_ids=prompt_ids,
                cause=h.cause,
            )
            base = 0  # experts/extension checks below run against the fresh segment
        else:
            if not 0 <= rec.segment < len(self.segments):
                raise TrajectoryError(f"turn refers to unknown segment {rec.segment}")
            seg = self.segments[rec.segment]
            base = len(seg)
        n_after = (len(seg.prompt_ids) if delta.new_segment else base) + len(env_ids) + len(gen_ids)
        experts = self._merged_experts(seg, delta.routed_experts, n_after)

        if delta.new_segment is not None:
            self.segments.append(seg)
        old_experts = seg.routed_experts
        seg.response_ids += env_ids
        seg.response_mask += _filled(MASK_CODE, 0, len(env_ids))
        seg.response_logprobs += _filled(LOGPROBS_CODE, 0, len(env_ids))
        seg.response_ids += gen_ids
        seg.response_mask += _filled(MASK_CODE, 1, len(gen_ids))
        seg.response_logprobs += gen_logprobs
        if experts is not None:
            seg.experts_writes.append((len(self.turns), _first_changed_row(old_experts, experts)))
        seg.routed_experts = experts
        for v in (rec.policy_version, rec.policy_version_end):
            if v is not None:
                seg.policy_version_min = (
                    v if seg.policy_version_min is None else min(seg.policy_version_min, v)
                )
                seg.policy_version_max = (
                    v if seg.policy_version_max is None else max(seg.policy_version_max, v)
                )
        self.turns.append(rec)
        c = self.counters
        c.turns += 1
        c.tool_calls += rec.tool_calls
        c.parse_failures += rec.parse_failures
        c.aborts_resumed += rec.resumed_after_abort
        c.overlong += rec.overlong
        c.replayed += rec.source == "replayed"
        if delta.new_segment is not None:
            c.rewrites_client += delta.new_segment.cause == "client"
            c.rewrites_template += delta.new_segment.cause == "template"
        return rec

    def note_overlong(self) -> None:
        """Count a request that could not be served because its prompt was too long."""
        self.counters.overlong += 1

    def note_turn_limited(self) -> None:
        """Count a request refused because the session's turn limit was spent."""
        self.counters.turn_limited += 1

    def note_infra_error(self) -> None:
        """Count a request the agent saw fail on infrastructure (nothing recorded for it)."""
        self.counters.infra_errors += 1

    def note_closed_mid_turn(self) -> None:
        """Count a turn cut off by the session's close (nothing recorded for it)."""
        self.counters.closed_mid_turn += 1

    def note_outage_hold(self) -> None:
        """Count a turn held while no replica could serve it."""
        self.counters.outage_holds += 1

    @staticmethod
    def _merged_experts(seg: Segment, reported: np.ndarray | None, n_after: int) -> np.ndarray | None:
        """The segment's experts array after a turn ending at sequence length ``n_after``."""
        old = seg.routed_experts
        if reported is None:
            if old is None:
                return None
            pad = np.full((n_after - len(old),) + old.shape[1:], experts_sentinel(old.dtype), dtype=old.dtype)
            return np.concatenate([old, pad])
        reported = np.asarray(reported)
        if reported.ndim != 3 or len(reported) != n_after - 1:
            raise TrajectoryError(
                f"routed_experts shape {reported.shape}: expected [{n_after - 1}, layers, top_k]"
            )
        if old is not None and old.shape[1:] != reported.shape[1:]:
            raise TrajectoryError(f"routed_experts shape {reported.shape} does not match earlier {old.shape}")
        if reported.size and (reported.min() < 0 or reported.max() > np.iinfo(np.int16).max):
            raise TrajectoryError("routed_experts ids out of range")
        max_id = int(reported.max()) if reported.size else 0
        dtype = _experts_dtype(max_id)
        if old is not None and old.dtype == np.int16:
            dtype = old.dtype  # never downgrade: earlier rows may hold ids >= 255
        rows = _as_experts(reported, dtype)
        last = np.full((1,) + reported.shape[1:], experts_sentinel(dtype), dtype=dtype)
        return np.concatenate([rows, last])

    # ------------------------------------------------------------------ checkpoints

    def mark(self) -> Mark:
        return Mark(len(self.turns), tuple(len(s.response_ids) for s in self.segments))

    def delta_since(self, mark: Mark) -> bytes:
        """npz bytes holding what changed after ``mark`` (all of it for ``Mark.EMPTY``)."""
        if mark.turns > len(self.turns) or len(mark.response_lens) > len(self.segments):
            raise CheckpointGapError(f"mark {mark} is ahead of this trajectory")
        arrays: dict[str, np.ndarray] = {}
        seg_meta: list[dict[str, Any]] = []
        for i, seg in enumerate(self.segments):
            is_new = i >= len(mark.response_lens)
            r_from = 0 if is_new else mark.response_lens[i]
            writes = [row for t, row in seg.experts_writes if t >= mark.turns]
            if not is_new and r_from == len(seg.response_ids) and not writes:
                continue
            e_from = None
            if seg.routed_experts is not None:
                e_from = 0 if is_new else min(writes + [len(seg.prompt_ids) + r_from])
                arrays[f"s{i}.experts"] = seg.routed_experts[e_from:]
            # np.array copies (no view may outlive this call: an array.array that exports its
            # buffer cannot grow). Same dtypes as ever; the mask is uint8 on disk.
            if is_new:
                arrays[f"s{i}.prompt_ids"] = np.array(seg.prompt_ids, dtype=np.int32)
            arrays[f"s{i}.response_ids"] = np.array(seg.response_ids[r_from:], dtype=np.int32)
            arrays[f"s{i}.response_mask"] = np.array(seg.response_mask[r_from:], dtype=np.uint8)
            arrays[f"s{i}.response_logprobs"] = np.array(seg.response_logprobs[r_from:], dtype=np.float32)
            seg_meta.append(
                {
                    "index": i,
                    "new": is_new,
                    "kind": seg.kind,
                    "rewritten": seg.rewritten,
                    "system_key": seg.system_key,
                    "response_from": r_from,
                    "experts_from": e_from,
                    "policy_version_min": seg.policy_version_min,
                    "policy_version_max": seg.policy_version_max,
                    "experts_writes": [[t, row] for t, row in seg.experts_writes if t >= mark.turns],
                }
            )
            if is_new and seg.cause is not None:  # left out when None: older payloads stay byte for byte
                seg_meta[-1]["cause"] = seg.cause
        meta = {
            "format": FORMAT_VERSION,
            "session_id": self.session_id,
            "metadata": self.metadata,
            "counters": _without_late_defaults(asdict(self.counters), _LATE_COUNTERS),
            "base_turns": mark.turns,
            "base_segments": len(mark.response_lens),
            "turns": [_without_late_defaults(asdict(t), _LATE_TURN_FIELDS) for t in self.turns[mark.turns :]],
            "segments": seg_meta,
        }
        try:
            blob = json.dumps(meta).encode()
        except (TypeError, ValueError) as exc:
            raise TrajectoryError(f"metadata must be JSON-serializable: {exc}") from exc
        arrays["meta"] = np.frombuffer(blob, dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, allow_pickle=False, **arrays)  # numbers only: never pickled
        return buf.getvalue()

    def to_bytes(self) -> bytes:
        return self.delta_since(Mark.EMPTY)

    def apply_checkpoint(self, payload: bytes) -> None:
        """Apply one ``delta_since`` payload; it must continue exactly this trajectory's state."""
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(arrays.pop("meta").tobytes())
        except _BAD_PAYLOAD as exc:
            raise TrajectoryError(f"not a trajectory payload: {exc}") from exc
        if meta.get("format") != FORMAT_VERSION:
            raise TrajectoryError(f"unknown trajectory format {meta.get('format')!r}")
        if meta["session_id"] != self.session_id:
            raise TrajectoryError(f"payload of session {meta['session_id']!r}, not {self.session_id!r}")
        if meta["base_turns"] != len(self.turns) or meta["base_segments"] != len(self.segments):
            raise CheckpointGapError(
                f"delta continues {meta['base_turns']} turns / {meta['base_segments']} segments, "
                f"trajectory has {len(self.turns)} / {len(self.segments)}"
            )
        staged = {i: s for i, s in enumerate(self.segments)}
        try:
            for sm in meta["segments"]:
                staged[sm["index"]] = self._staged_segment(staged.get(sm["index"]), sm, arrays, len(staged))
            turns = [TurnRecord(**t) for t in meta["turns"]]
            counters = Counters(**meta["counters"])
        except (KeyError, TypeError) as exc:
            raise TrajectoryError(f"malformed trajectory payload: {exc!r}") from exc
        self.segments = [staged[i] for i in range(len(staged))]
        self.turns.extend(turns)
        self.metadata = meta["metadata"]
        self.counters = counters

    @staticmethod
    def _staged_segment(
        old: Segment | None,
        sm: dict[str, Any],
        arrays: dict[str, np.ndarray],
        n_staged: int,
    ) -> Segment:
        """Segment ``sm["index"]`` with the delta applied (a copy; ``old`` is not touched)."""
        i = sm["index"]
        if sm["new"]:
            if old is not None or i != n_staged:
                raise CheckpointGapError(f"new segment {i} does not follow the {n_staged} known segments")
            seg = Segment(
                kind=sm["kind"],
                rewritten=sm["rewritten"],
                system_key=sm["system_key"],
                prompt_ids=_typed(IDS_CODE, arrays[f"s{i}.prompt_ids"]),
                cause=sm.get("cause"),
            )
        else:
            if old is None or sm["response_from"] != len(old.response_ids):
                raise CheckpointGapError(f"segment {i}: delta starts at response token {sm['response_from']}")
            # prompt_ids is never mutated after a segment opens, so it is shared; the rest is copied
            seg = Segment(
                kind=old.kind,
                rewritten=old.rewritten,
                system_key=old.system_key,
                prompt_ids=old.prompt_ids,
                response_ids=old.response_ids[:],
                response_mask=old.response_mask[:],
                response_logprobs=old.response_logprobs[:],
                routed_experts=old.routed_experts,
                cause=old.cause,
                experts_writes=list(old.experts_writes),
            )
        seg.response_ids += _typed(IDS_CODE, arrays[f"s{i}.response_ids"])
        seg.response_mask += _typed(MASK_CODE, arrays[f"s{i}.response_mask"])
        seg.response_logprobs += _typed(LOGPROBS_CODE, arrays[f"s{i}.response_logprobs"])
        if sm["experts_from"] is not None:
            rows = arrays[f"s{i}.experts"]
            keep = seg.routed_experts[: sm["experts_from"]] if seg.routed_experts is not None else rows[:0]
            dtype = np.promote_types(keep.dtype, rows.dtype)  # uint8 rows + int16 rows -> int16
            seg.routed_experts = np.concatenate([_as_experts(keep, dtype), _as_experts(rows, dtype)])
        seg.experts_writes.extend((t, row) for t, row in sm["experts_writes"])
        seg.policy_version_min = sm["policy_version_min"]
        seg.policy_version_max = sm["policy_version_max"]
        if seg.routed_experts is not None and len(seg.routed_experts) != len(seg):
            raise TrajectoryError(
                f"segment {i}: {len(seg.routed_experts)} experts rows for {len(seg)} tokens"
            )
        return seg

    @classmethod
    def from_checkpoints(cls, payloads: Sequence[bytes]) -> Trajectory:
        """Rebuild from a full payload or a chain of deltas (the first continues the empty state)."""
        if not payloads:
            raise TrajectoryError("no checkpoints")
        try:
            with np.load(io.BytesIO(payloads[0]), allow_pickle=False) as z:
                session_id = json.loads(z["meta"].tobytes())["session_id"]
        except _BAD_PAYLOAD as exc:
            raise TrajectoryError(f"not a trajectory payload: {exc}") from exc
        traj = cls(session_id=session_id)
        for p in payloads:
            traj.apply_checkpoint(p)
        return traj

    @classmethod
    def from_bytes(cls, payload: bytes) -> Trajectory:
        return cls.from_checkpoints([payload])


# Fields added after format 1 was first written, with their defaults: a field at its default
# is left out of the payload, so a trajectory that does not use it serializes byte for byte as
# before (tests/proxy/fixtures/trajectory_format1), and a reader fills the default back in.
_LATE_TURN_FIELDS: dict[str, Any] = {
    "source": "generated",
    "answer": None,
    "policy_version": None,
    "policy_version_end": None,
}
_LATE_COUNTERS: dict[str, Any] = {
    "replayed": 0,
    "rewrites_client": 0,
    "rewrites_template": 0,
    "turn_limited": 0,
    "infra_errors": 0,
    "outage_holds": 0,
    "closed_mid_turn": 0,
}


def _without_late_defaults(d: dict[str, Any], late: dict[str, Any]) -> dict[str, Any]:
    for k, default in late.items():
        if k in d and d[k] == default:
            del d[k]
    return d


def _first_changed_row(old: np.ndarray | None, new: np.ndarray) -> int:
    """First row where ``new`` differs from ``old`` (rows past ``old``'s end count as changed)."""
    if old is None:
        return 0
    n = min(len(old), len(new))
    if old.dtype != new.dtype:
        old = _as_experts(old, new.dtype)
    diff = np.flatnonzero((old[:n] != new[:n]).reshape(n, -1).any(axis=1))
    return int(diff[0]) if len(diff) else n
