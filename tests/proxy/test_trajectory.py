"""proxy.trajectory: the accounting fold, routed experts, npz serialization and checkpoint deltas."""

from __future__ import annotations

import io
import json
from array import array
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.trajectory import (
    CheckpointGapError,
    Mark,
    SegmentHeader,
    Trajectory,
    TrajectoryError,
    TurnDelta,
    TurnRecord,
    experts_sentinel,
)
from tests._hypothesis import examples

L, K = 2, 2  # layers, top_k of the fake MoE


def rec(segment: int, finish: str = "stop", **kw) -> TurnRecord:
    return TurnRecord(
        segment=segment, prompt_tokens=0, completion_tokens=0, env_tokens_added=0, finish_reason=finish, **kw
    )


def opening(index: int, prompt: list[int], gen: list[int], *, experts=None, kind="main", **kw) -> TurnDelta:
    return TurnDelta(
        record=rec(index, **kw),
        gen_ids=gen,
        gen_logprobs=[-0.5] * len(gen),
        new_segment=SegmentHeader(kind, False, f"key-{kind}", prompt),
        routed_experts=experts,
    )


def extending(index: int, env: list[int], gen: list[int], *, experts=None, version=None, **kw) -> TurnDelta:
    return TurnDelta(
        record=rec(index, policy_version=version, **kw),
        env_ids=env,
        gen_ids=gen,
        gen_logprobs=[-0.25 * (i + 1) for i in range(len(gen))],
        routed_experts=experts,
    )


def experts(n: int, value: int) -> np.ndarray:
    return np.full((n, L, K), value, dtype=np.int32)  # vLLM decodes R3 as int32


def same(a: Trajectory, b: Trajectory) -> None:
    assert (a.session_id, a.metadata, a.turns, a.counters) == (b.session_id, b.metadata, b.turns, b.counters)
    assert len(a.segments) == len(b.segments)
    for x, y in zip(a.segments, b.segments, strict=False):
        assert (
            x.kind,
            x.rewritten,
            x.system_key,
            x.prompt_ids,
            x.response_ids,
            x.response_mask,
            x.response_logprobs,
            x.policy_version_min,
            x.policy_version_max,
        ) == (
            y.kind,
            y.rewritten,
            y.system_key,
            y.prompt_ids,
            y.response_ids,
            y.response_mask,
            y.response_logprobs,
            y.policy_version_min,
            y.policy_version_max,
        )
        if x.routed_experts is None:
            assert y.routed_experts is None
        else:
            assert x.routed_experts.dtype == y.routed_experts.dtype
            np.testing.assert_array_equal(x.routed_experts, y.routed_experts)


# ------------------------------------------------------------------ fold


def test_fold_appends_env_then_generation_with_mask_and_logprobs():
    t = Trajectory("s")
    t.apply(opening(0, [1, 2, 3], [4, 5], tool_calls=1))
    t.apply(extending(0, [6, 7], [8], version=3, parse_failures=1, resumed_after_abort=2))
    t.apply(extending(0, [9], [10, 11], finish="length", version=1, overlong=True))
    t.apply(extending(0, [], [12], finish="length"))  # cut by the client's max_tokens: not overlong
    seg = t.segments[0]
    assert seg.prompt_ids.tolist() == [1, 2, 3]
    assert seg.response_ids.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert seg.response_mask.tolist() == [1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert seg.response_logprobs.tolist() == [-0.5, -0.5, 0.0, 0.0, -0.25, 0.0, -0.25, -0.5, -0.25]
    assert seg.full_ids == list(range(1, 13)) and len(seg) == 12
    assert (seg.policy_version_min, seg.policy_version_max) == (1, 3)
    c = t.counters
    assert (c.turns, c.tool_calls, c.parse_failures, c.aborts_resumed, c.overlong) == (4, 1, 1, 2, 1)
    t.note_overlong()
    assert t.counters.overlong == 2


def test_logprobs_are_stored_as_float32():
    t = Trajectory("s")
    t.apply(
        TurnDelta(
            record=rec(0),
            gen_ids=[1],
            gen_logprobs=[-0.1],
            new_segment=SegmentHeader("main", False, "k", [0]),
        )
    )
    assert t.segments[0].response_logprobs.tolist() == [float(np.float32(-0.1))]


def test_tokens_are_packed_typed_arrays_and_full_ids_a_plain_list():
    t = Trajectory("s")
    t.apply(opening(0, (1, 2), [151643], experts=None))
    t.apply(extending(0, np.array([2**31 - 1], dtype=np.int64), [3]))  # numpy input is accepted too
    seg = t.segments[0]
    codes = [
        (a.typecode, a.itemsize)
        for a in (seg.prompt_ids, seg.response_ids, seg.response_mask, seg.response_logprobs)
    ]
    assert codes == [("i", 4), ("i", 4), ("b", 1), ("f", 4)]
    full = seg.full_ids
    assert type(full) is list and all(type(x) is int for x in full) and full == [1, 2, 151643, 2**31 - 1, 3]
    full.append(0)  # a fresh list each time: the caller may extend it
    header_ids = array("i", [7, 8])
    t.apply(opening(1, header_ids, [9], kind="side"))
    header_ids.append(0)  # the segment holds its own copy of the header's prompt
    assert t.segments[1].prompt_ids.tolist() == [7, 8]
    assert len(seg) == 5 and seg.response_ids[-1] == 3 and seg.response_ids[1:2].tolist() == [2**31 - 1]


@pytest.mark.parametrize(
    "delta",
    [
        TurnDelta(record=rec(0), env_ids=[2**31], gen_ids=[1], gen_logprobs=[0.0]),
        TurnDelta(record=rec(0), gen_ids=[-(2**31) - 1], gen_logprobs=[0.0]),
        TurnDelta(record=rec(0), gen_ids=np.array([2**40]), gen_logprobs=[0.0]),
        TurnDelta(record=rec(0), gen_ids=np.array([1.5]), gen_logprobs=[0.0]),
        TurnDelta(record=rec(0), gen_ids=["7"], gen_logprobs=[0.0]),
        TurnDelta(record=rec(0), gen_ids=[1], gen_logprobs=["x"]),
        TurnDelta(
            record=rec(1),
            gen_ids=[1],
            gen_logprobs=[0.0],
            new_segment=SegmentHeader("side", False, "k", [2**32]),
        ),
    ],
)
def test_ids_outside_int32_or_non_numbers_are_rejected_before_any_change(delta):
    t = Trajectory("s")
    t.apply(opening(0, [1, 2], [3]))
    before = Trajectory.from_bytes(t.to_bytes())
    with pytest.raises(TrajectoryError):
        t.apply(delta)
    same(t, before)


@pytest.mark.parametrize(
    "bad",
    [
        TurnDelta(record=rec(1), gen_ids=[1], gen_logprobs=[0.0]),  # unknown segment
        TurnDelta(record=rec(0), gen_ids=[1, 2], gen_logprobs=[0.0]),  # logprobs length
        TurnDelta(
            record=rec(0), gen_ids=[1], gen_logprobs=[0.0], new_segment=SegmentHeader("side", False, "k", [1])
        ),
        TurnDelta(
            record=rec(1),
            gen_ids=[1],
            gen_logprobs=[0.0],
            env_ids=[3],
            new_segment=SegmentHeader("side", False, "k", [1]),
        ),  # env on a new segment
        TurnDelta(record=rec(0), gen_ids=[1], gen_logprobs=[0.0], routed_experts=experts(2, 1)),  # rows
        TurnDelta(
            record=rec(0), gen_ids=[1], gen_logprobs=[0.0], routed_experts=np.zeros((4, 3, 2), np.int32)
        ),
        TurnDelta(record=rec(0), gen_ids=[1], gen_logprobs=[0.0], routed_experts=experts(4, -2)),
    ],
)
def test_rejected_delta_leaves_trajectory_unchanged(bad):
    t = Trajectory("s")
    t.apply(opening(0, [1, 2], [3], experts=experts(2, 1)))
    before = Trajectory.from_bytes(t.to_bytes())
    with pytest.raises(TrajectoryError):
        t.apply(bad)
    same(t, before)


# ------------------------------------------------------------------ routed experts


def test_experts_aligned_per_token_with_sentinel_for_last():
    t = Trajectory("s")
    t.apply(opening(0, [1, 2, 3], [4, 5], experts=experts(4, 7)))
    e = t.segments[0].routed_experts
    assert e.dtype == np.uint8 and e.shape == (5, L, K)
    assert (e[:4] == 7).all() and (e[4] == experts_sentinel(np.uint8)).all()
    # the next forward re-reports every earlier position (the last sampled token included)
    t.apply(extending(0, [6], [7], experts=experts(6, 9)))
    e = t.segments[0].routed_experts
    assert e.shape == (7, L, K) and (e[:6] == 9).all() and (e[6] == 255).all()


def test_experts_upgrade_to_int16_keeps_unknown_rows_unknown():
    t = Trajectory("s")
    t.apply(opening(0, [1, 2], [3], experts=experts(2, 4)))
    t.apply(extending(0, [4], [5], experts=None))  # a turn without report pads with sentinels
    e = t.segments[0].routed_experts
    assert e.dtype == np.uint8 and (e[2:] == 255).all() and len(e) == 5
    big = experts(5, 300)
    big[0] = 1
    t.apply(extending(0, [], [6], experts=big))
    e = t.segments[0].routed_experts
    assert e.dtype == np.int16 and e.shape == (6, L, K)
    assert (e[0] == 1).all() and (e[1:5] == 300).all() and (e[5] == experts_sentinel(np.int16)).all()
    t.apply(extending(0, [], [7], experts=experts(6, 2)))  # small ids later: never downgrade
    assert t.segments[0].routed_experts.dtype == np.int16


def test_dense_segments_have_no_experts():
    t = Trajectory("s")
    t.apply(opening(0, [1], [2]))
    t.apply(extending(0, [3], [4]))
    assert t.segments[0].routed_experts is None


# ------------------------------------------------------------------ serialization


def build() -> Trajectory:
    t = Trajectory("sess-1", metadata={"task": "hello", "attempt": 1})
    t.apply(opening(0, [1, 2, 3], [4, 5], experts=experts(4, 1), tool_calls=1, replica="r0", latency_s=0.5))
    t.apply(opening(1, [9, 9], [8], kind="side"))
    t.apply(extending(0, [6], [7, 2], experts=experts(7, 3), version=5))
    return t


def test_roundtrip_is_exact_and_compact():
    t = build()
    payload = t.to_bytes()
    same(Trajectory.from_bytes(payload), t)
    with np.load(io.BytesIO(payload)) as z:
        assert z["s0.response_logprobs"].dtype == np.float32 and z["s0.response_ids"].dtype == np.int32
        assert z["s0.response_mask"].dtype == np.uint8 and z["s0.experts"].dtype == np.uint8


def test_checkpoint_deltas_rebuild_every_prefix():
    t = Trajectory("s", metadata={"n": 0})
    deltas, states, mark = [], [], Mark.EMPTY
    steps = [
        opening(0, [1, 2, 3], [4], experts=experts(3, 1)),
        extending(0, [5], [6, 7], experts=experts(6, 2)),
        opening(1, [1], [2], kind="side"),
        extending(0, [8], [9], experts=experts(8, 300)),
        extending(1, [3], [4]),
        extending(0, [], [10], finish="length", overlong=True),
    ]
    for i, step in enumerate(steps):
        t.apply(step)
        t.metadata["n"] = i
        deltas.append(t.delta_since(mark))
        mark = t.mark()
        states.append(t.to_bytes())
    for n in range(1, len(steps) + 1):  # a crash after any turn leaves all before it recoverable
        same(Trajectory.from_checkpoints(deltas[:n]), Trajectory.from_bytes(states[n - 1]))
    same(Trajectory.from_checkpoints(deltas), t)
    assert len(deltas[-1]) < len(states[-1])


def test_delta_carries_only_new_tokens():
    t = build()
    m = t.mark()
    t.apply(extending(1, [5], [6]))
    with np.load(io.BytesIO(t.delta_since(m))) as z:
        assert sorted(z.files) == ["meta", "s1.response_ids", "s1.response_logprobs", "s1.response_mask"]
        assert z["s1.response_ids"].tolist() == [5, 6]


def test_metadata_and_counters_only_delta():
    t = build()
    m = t.mark()
    t.note_overlong()
    t.metadata["reward"] = 1.0
    r = Trajectory.from_checkpoints([build().to_bytes(), t.delta_since(m)])
    same(r, t)


def test_gaps_and_foreign_payloads_are_detected():
    t = Trajectory("s")
    t.apply(opening(0, [1], [2]))
    d1 = t.delta_since(Mark.EMPTY)
    m = t.mark()
    t.apply(extending(0, [3], [4]))
    d2 = t.delta_since(m)
    m = t.mark()
    t.apply(extending(0, [5], [6]))
    d3 = t.delta_since(m)
    with pytest.raises(CheckpointGapError):
        Trajectory.from_checkpoints([d1, d3])
    with pytest.raises(CheckpointGapError):
        Trajectory.from_checkpoints([d2])
    r = Trajectory.from_checkpoints([d1, d2])
    with pytest.raises(CheckpointGapError):
        r.apply_checkpoint(d2)  # applying twice
    with pytest.raises(TrajectoryError, match="session"):
        Trajectory("other").apply_checkpoint(d1)
    with pytest.raises(TrajectoryError):
        Trajectory.from_bytes(b"not an npz")
    with pytest.raises(CheckpointGapError):
        t.delta_since(Mark(99, ()))
    t.metadata["bad"] = object()
    with pytest.raises(TrajectoryError, match="JSON"):
        t.to_bytes()


FORMAT1 = Path(__file__).parent / "fixtures" / "trajectory_format1"


def format1_steps() -> list[TurnDelta]:
    """The turns behind FORMAT1's payloads, written by the list-backed Segment (commit e9c0a93):
    delta{i}.npz = delta after turn i (metadata["turn"] = i), full.npz = to_bytes() after a
    final note_overlong(). Ids include a real vocabulary's largest ones (151643, 151668)."""
    return [
        TurnDelta(
            record=rec(0, tool_calls=1, replica="r0", latency_s=0.5, policy_version=2),
            gen_ids=[4, 151643],
            gen_logprobs=[-0.1, -2.5e-7],
            new_segment=SegmentHeader("main", False, "key-main", [1, 2, 3]),
            routed_experts=experts(4, 1),
        ),
        TurnDelta(
            record=rec(1),
            gen_ids=[8],
            gen_logprobs=[-1.25],
            new_segment=SegmentHeader("side", True, "key-side", [9, 9]),
        ),
        TurnDelta(
            record=rec(0, parse_failures=1, policy_version=3, policy_version_end=4),
            env_ids=[6, 151668],
            gen_ids=[7, 2],
            gen_logprobs=[-0.3333, -17.0],
            routed_experts=experts(8, 300),
        ),
        TurnDelta(
            record=rec(1, finish="length", overlong=True), env_ids=[5], gen_ids=[6], gen_logprobs=[-3.0e-3]
        ),
    ]


def npz_entries(payload: bytes) -> dict[str, tuple[str, bytes]]:
    with np.load(io.BytesIO(payload)) as z:
        return {k: (z[k].dtype.str, z[k].tobytes()) for k in z.files}


def without_turn_versions(entries: dict[str, tuple[str, bytes]]) -> dict[str, tuple[str, bytes]]:
    """The entries as FORMAT1 wrote them: turn records did not carry their weights versions
    then (TurnRecord.policy_version/_end; the segments' ranges were there already)."""
    meta = json.loads(entries["meta"][1])
    for turn in meta["turns"]:
        turn.pop("policy_version", None)
        turn.pop("policy_version_end", None)
    return {**entries, "meta": (entries["meta"][0], json.dumps(meta).encode())}


def as_format1(t: Trajectory) -> Trajectory:
    """A copy of ``t`` whose turn records lack their versions, as FORMAT1's did."""
    out = Trajectory.from_bytes(t.to_bytes())
    out.turns = [replace(r, policy_version=None, policy_version_end=None) for r in out.turns]
    return out


def test_payloads_written_by_the_list_backed_segment_still_load_and_are_reproduced_exactly():
    t = Trajectory("sess-fmt1", metadata={"task": "hello", "attempt": 1})
    deltas, mark = [], Mark.EMPTY
    for i, step in enumerate(format1_steps()):
        t.apply(step)
        t.metadata["turn"] = i
        stored = (FORMAT1 / f"delta{i}.npz").read_bytes()
        # same arrays, dtypes, meta (but for the turns' own versions, which FORMAT1 lacked)
        assert without_turn_versions(npz_entries(t.delta_since(mark))) == npz_entries(stored)
        deltas.append(stored)
        mark = t.mark()
    same(Trajectory.from_checkpoints(deltas), as_format1(t))
    assert [(r.policy_version, r.policy_version_end) for r in t.turns][::2] == [(2, None), (3, 4)]
    t.note_overlong()
    full = (FORMAT1 / "full.npz").read_bytes()
    assert without_turn_versions(npz_entries(t.to_bytes())) == npz_entries(full)
    loaded = Trajectory.from_bytes(full)
    same(loaded, as_format1(t))
    assert npz_entries(loaded.to_bytes()) == npz_entries(full)  # an old payload re-written: unchanged
    assert loaded.segments[0].response_ids.tolist() == [4, 151643, 6, 151668, 7, 2]
    assert loaded.segments[0].response_logprobs.tolist()[-1] == -17.0
    assert loaded.segments[0].routed_experts.dtype == np.int16


def test_checkpoint_is_staged_on_copies_of_the_token_arrays():
    base = build()
    m = base.mark()
    base.apply(extending(0, [1], [2], experts=experts(9, 4)))
    r = Trajectory.from_bytes(build().to_bytes())
    held = r.segments[0].response_ids  # e.g. a reader still holding the pre-checkpoint state
    r.apply_checkpoint(base.delta_since(m))
    same(r, base)
    assert held.tolist() == [4, 5, 6, 7, 2] and r.segments[0].response_ids.tolist() == [4, 5, 6, 7, 2, 1, 2]


_turn = st.tuples(
    st.integers(0, 3),  # segment choice (new segment when beyond the existing ones)
    st.lists(st.integers(0, 50), max_size=3),  # env
    st.lists(st.integers(0, 50), min_size=1, max_size=3),  # gen
    st.sampled_from([None, 10, 400]),  # experts max id: none / uint8 / int16
    st.booleans(),  # checkpoint after this turn
)


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(_turn, min_size=1, max_size=10))
def test_any_checkpoint_schedule_rebuilds_the_trajectory(turns):
    t = Trajectory("s")
    rng = np.random.default_rng(0)
    chunks, mark = [], Mark.EMPTY
    for choice, env, gen, top, cut in turns:
        n_segs = len(t.segments)
        if choice >= n_segs:
            prompt = [1, 2]
            n_after = len(prompt) + len(gen)
            delta_kw = {"new_segment": SegmentHeader("side", False, "k", prompt)}
            env = []
        else:
            n_after = len(t.segments[choice]) + len(env) + len(gen)
            delta_kw = {"env_ids": env}
        ex = None if top is None else rng.integers(0, top, size=(n_after - 1, L, K))
        idx = min(choice, n_segs)
        t.apply(
            TurnDelta(
                record=rec(idx), gen_ids=gen, gen_logprobs=[-1.0] * len(gen), routed_experts=ex, **delta_kw
            )
        )
        if cut:
            chunks.append(t.delta_since(mark))
            mark = t.mark()
    chunks.append(t.delta_since(mark))
    same(Trajectory.from_checkpoints(chunks), t)
    same(Trajectory.from_bytes(t.to_bytes()), t)


def test_same_ids_compares_across_sequence_types():
    from array import array

    from proxy.trajectory import id_array, same_ids

    a = id_array([1, 2, 70000])
    assert same_ids(a, [1, 2, 70000]) and same_ids((1, 2, 70000), a) and same_ids(a, array("i", a))
    assert not same_ids(a, [1, 2]) and not same_ids(a, [1, 2, 3]) and not same_ids(a, [1, 2, 2**40])
    assert not same_ids(a, ["1", "2", "x"])
    assert a != [1, 2, 70000]  # the trap same_ids exists for


def test_a_segments_cause_is_kept_through_bytes_and_checkpoints():
    """Why a segment opened (SegmentHeader.cause) survives serialization and the checkpoint
    chain; a segment without one writes no key (older payloads stay byte for byte)."""
    t = Trajectory(session_id="s")
    checkpoints = []
    for i, (rewritten, cause) in enumerate([(False, None), (True, "client"), (True, "template")]):
        mark = t.mark()
        header = SegmentHeader("main", rewritten, "k", [1, i], cause=cause)
        t.apply(TurnDelta(record=rec(i), gen_ids=[5], gen_logprobs=[-0.1], new_segment=header))
        checkpoints.append(t.delta_since(mark))
    causes = [None, "client", "template"]
    assert [s.cause for s in t.segments] == causes
    assert [s.cause for s in Trajectory.from_bytes(t.to_bytes()).segments] == causes
    assert [s.cause for s in Trajectory.from_checkpoints(checkpoints).segments] == causes
    with np.load(io.BytesIO(t.to_bytes())) as z:
        seg_meta = json.loads(z["meta"].tobytes())["segments"]
    assert "cause" not in seg_meta[0] and seg_meta[1]["cause"] == "client"
