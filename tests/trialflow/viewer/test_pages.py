"""The viewer's pages over a LocalStore holding a trajectory made by the proxy's own fold
(`Trajectory.apply`, serialized with `to_bytes` / checkpoint deltas as the session writes
them) and a `TrialResult`, served by the real aiohttp app: agent-written markup is shown inert,
bad input is one line on an error page (never a traceback), huge trajectories are paged.
The browser test (test_browser.py) runs a real trial and looks at the pages in chromium."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.trajectory import SegmentHeader, Trajectory, TurnDelta, TurnRecord
from trialflow.storage import AttemptRecord, LocalStore, TrialKeys, record_replay_key, trial_result_key
from trialflow.viewer import segment_url, trial_url, turn_url
from trialflow.viewer._render import PAGE_TOKENS, TURNS_SHOWN
from trialflow.viewer._server import CSP, Viewer, make_app
from workflows.shared import TrialResult

BATCH, TRIAL = "b-1", "trial-b-1-create-file-0"
HOSTILE = '<script>window.pwned=1</script><img src=x onerror="alert(1)">'


def _answer(content: str, calls: list[dict]) -> dict:
    return {
        "protocol": "openai", "id": "r", "created": 1, "content": content, "reasoning": None,
        "tool_calls": calls, "finish_reason": "tool_calls", "stop_sequence": None,
    }  # fmt: skip


def make_trajectory(extra_turns: int = 0, gen_len: int = 3) -> Trajectory:
    t = Trajectory(session_id="s")
    call = {"id": "call_1", "name": "shell", "arguments": {"command": f"echo '{HOSTILE}'"}}
    rec = TurnRecord(
        0, 4, gen_len, 0, "tool_calls", tool_calls=1, source="replayed", answer=_answer(HOSTILE, [call])
    )
    t.apply(TurnDelta(rec, list(range(100, 100 + gen_len)), [-0.01] * gen_len,
                      new_segment=SegmentHeader("main", False, "k", [1, 2, 3, 4])))  # fmt: skip
    for i in range(1 + extra_turns):
        n = len(t.segments[0])
        rec = TurnRecord(0, n + 2, 2, 2, "stop", replica="http://r", answer=_answer(f"done {i}", []))
        t.apply(TurnDelta(rec, [7, 8], [-3.0, -0.2], env_ids=[5, 6]))
    t.apply(TurnDelta(TurnRecord(1, 3, 1, 0, "stop"), [9], [-0.5],
                      new_segment=SegmentHeader("main", True, "k", [1, 2, 9], cause="client")))  # fmt: skip
    return t


def make_store(tmp_path, trajectory: Trajectory | None = None, *, lost_attempt: bool = True) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    records = []
    if lost_attempt:  # attempt 1: lost, one checkpoint
        k1 = TrialKeys(BATCH, TRIAL, 1)
        part = Trajectory(session_id="s1")
        part.apply(TurnDelta(TurnRecord(0, 2, 1, 0, "stop"), [3], [-1.0],
                             new_segment=SegmentHeader("main", False, "k", [1, 2])))  # fmt: skip
        store.put_bytes(k1.checkpoint(0), part.to_bytes())
        records.append(AttemptRecord(attempt=1, checkpoints_uri=store.uri(k1.checkpoints) + "/"))
    n = len(records) + 1
    keys = TrialKeys(BATCH, TRIAL, n)
    uri = store.put_bytes(keys.trajectory, (trajectory or make_trajectory()).to_bytes())
    records.append(
        AttemptRecord(
            attempt=n, checkpoints_uri=store.uri(keys.checkpoints) + "/", trajectory_uri=uri, complete=True
        )
    )
    store.put_bytes(keys.log("scaffold.log"), f"agent said {HOSTILE}\n".encode())
    store.put_bytes(keys.log("verifier/stdout.txt"), b"PASS test_hello \x1b[32mok\x1b[0m\n")
    result = TrialResult(
        trial_id=TRIAL, batch_id=BATCH, task_name="create-file", scaffold="test", sample_index=0,
        reward=1.0, rewards={"reward": 1.0}, reward_valid=True, termination_reason="submitted",
        attempts=n, attempt_records=records, turns=3, replayed_turns=1, generated_turns=2,
    )  # fmt: skip
    store.put_bytes(trial_result_key(BATCH, TRIAL), result.model_dump_json().encode())
    return store


@pytest.fixture
async def serve():
    clients = []

    async def go(store, **kw) -> TestClient:
        client = TestClient(TestServer(make_app(Viewer(store, "test store", "http://ui:8233", **kw))))
        await client.start_server()
        clients.append(client)
        return client

    yield go
    for c in clients:
        await c.close()


async def _get(client: TestClient, url: str, status: int = 200) -> str:
    resp = await client.get(url)
    text = await resp.text()
    assert resp.status == status, text
    assert resp.headers["Content-Security-Policy"] == CSP and "script-src" not in CSP  # default-src 'none'
    assert "Traceback" not in text
    return text


def _inert(text: str) -> None:
    """No tag an agent wrote survives as markup: the pages carry no <script> or <img> at all."""
    assert "<script" not in text.lower() and "<img" not in text.lower() and 'onerror="' not in text
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in text


async def test_index_batch_trial_turn_and_segment(tmp_path, serve):
    client = await serve(make_store(tmp_path))
    assert f'href="/batch/{BATCH}"' in await _get(client, "/")
    batch = await _get(client, f"/batch/{BATCH}")
    assert trial_url(TRIAL, batch_id=BATCH) in batch and "1.000" in batch and "1 / 2" in batch

    page = await _get(client, trial_url(TRIAL))  # the batch found from the trial id
    _inert(page)
    assert 'href="http://ui:8233/namespaces/default/workflows/trial-b-1-create-file-0"' in page
    assert "lost attempt: rebuilt from 1 checkpoints" in page
    assert "the main thread&#x27;s first request" in page and "the client rewrote its history" in page
    assert 'class="badge replayed"' in page and 'class="badge generated"' in page
    assert "PASS test_hello ok" in page  # ANSI stripped
    assert turn_url(TRIAL, 1, batch_id=BATCH, attempt=2).replace("&", "&amp;") in page

    turn = await _get(client, turn_url(TRIAL, 1, attempt=2))
    _inert(turn)
    assert 'id="tool-calls"' in turn and "call_1" in turn
    assert turn.count('data-mask="1"') == 3 and 'data-mask="0"' not in turn  # its own 3 generated tokens
    turn2 = await _get(client, turn_url(TRIAL, 2))  # default: the last attempt
    assert turn2.count('data-mask="0"') == 2 and turn2.count('data-mask="1"') == 2
    seg = await _get(client, segment_url(TRIAL, 0, attempt=2))
    assert seg.count('class="turnmark"') == 2 and "[100]" in seg  # ids without a tokenizer


async def test_a_tokenizer_decodes_each_token_and_its_text_is_escaped(tmp_path, serve):
    class Tok:  # the one method the viewer calls, as transformers' tokenizers answer it
        def decode(self, ids, skip_special_tokens=False):
            return "<b>" if ids == [100] else f"t{ids[0]}"

    client = await serve(make_store(tmp_path), tokenizer=Tok())
    turn = await _get(client, turn_url(TRIAL, 1))
    assert "&lt;b&gt;</span>" in turn and "<b>" not in turn.split("<h2>tokens")[1]


@pytest.mark.parametrize(
    ("url", "status", "line"),
    [
        ("/batch/nope", 404, "no batch &#x27;nope&#x27; in this store"),
        ("/trial/trial-nope-x-0", 404, "no trial &#x27;trial-nope-x-0&#x27; in this store"),
        (f"/trial/{TRIAL}?batch=other", 404, "no stored result for trial"),
        (f"/trial/{TRIAL}/turn/99", 404, "has 3 turns, no turn 99"),
        (f"/trial/{TRIAL}/turn/x", 400, "n must be a number"),
        (f"/trial/{TRIAL}/segment/7", 404, "has 2 segments, no segment 7"),
        (f"/trial/{TRIAL}/turn/1?attempt=9", 404, "no attempt 9 in this trial"),
        (f"/trial/{TRIAL}/segment/0?offset=-1", 400, "offset must not be negative"),
        ("/no/such/page", 404, "Not Found"),
    ],
)
async def test_bad_input_is_one_line(tmp_path, serve, url, status, line):
    client = await serve(make_store(tmp_path))
    text = await _get(client, url, status)
    assert line in text
    assert len(re.findall(r'<p class="err"', text)) == 1


async def test_corrupt_trajectory_and_result_are_one_line_each(tmp_path, serve):
    store = make_store(tmp_path)
    store.put_bytes(TrialKeys(BATCH, TRIAL, 2).trajectory, b"PK\x03\x04 not an npz")
    client = await serve(store)
    page = await _get(client, trial_url(TRIAL))
    assert "no trajectory: TrajectoryError: not a trajectory payload" in page
    assert "PASS test_hello" in page  # the rest of the trial still shows
    assert "no trajectory" in await _get(client, turn_url(TRIAL, 1), 404)
    store.put_bytes(trial_result_key(BATCH, TRIAL), b"{not json")
    assert "is not a trial result" in await _get(client, trial_url(TRIAL), 500)
    assert "is not a trial result" in await _get(client, f"/batch/{BATCH}")  # the row, not the page


async def test_replay_reports_show_their_diff(tmp_path, serve):
    store = make_store(tmp_path)
    diff = "request 1 differs from recorded turn 1 at prompt token 40\n--- recorded\n+++ request\n-alpha\n+beta <script>"
    store.put_bytes(record_replay_key(BATCH, TRIAL, "attempt-2-x"),
                    b'{"attempt": 2, "replayed": 1, "replayable_turns": 4, "reproduced": false, '
                    b'"divergence": {"turn": 1}, "diff": ' + __import__("json").dumps(diff).encode() + b"}")  # fmt: skip
    store.put_bytes(record_replay_key(BATCH, TRIAL, "attempt-2-y"), b"garbage")
    page = await _get(await serve(store), trial_url(TRIAL))
    assert (
        '<span class="del">-alpha</span>' in page and '<span class="add">+beta &lt;script&gt;</span>' in page
    )
    assert "diverged" in page and "unreadable report" in page


async def test_huge_trajectories_are_paged(tmp_path, serve):
    traj = make_trajectory(extra_turns=TURNS_SHOWN + 10, gen_len=PAGE_TOKENS + 500)
    client = await serve(make_store(tmp_path, traj, lost_attempt=False))
    page = await _get(client, trial_url(TRIAL))
    assert f"first {TURNS_SHOWN} of {TURNS_SHOWN + 13} turns shown" in page
    assert page.count('class="badge ') == TURNS_SHOWN
    turn = await _get(client, turn_url(TRIAL, 1))
    assert turn.count('data-mask="1"') == PAGE_TOKENS and "the rest" in turn
    seg = await _get(client, segment_url(TRIAL, 0))
    assert len(re.findall(r'<span class="t[peg]"[^>]* title=', seg)) == PAGE_TOKENS and "next tokens" in seg
    last = await _get(client, segment_url(TRIAL, 0, offset=10**9))
    assert "previous tokens" in last and "next tokens" not in last


def _view_cli(*args: str, env: dict | None = None):
    from typer.testing import CliRunner

    from trialflow.cli import app

    return CliRunner().invoke(app, ["view", *args], env=env)


def test_view_refuses_a_missing_store_in_one_line(tmp_path):
    res = _view_cli("--store-dir", str(tmp_path / "nope"), env={"TRIALFLOW_S3_ENDPOINT": ""})
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [
        f"error: cannot read the store (the directory {tmp_path / 'nope'}): no store directory {tmp_path / 'nope'}"
    ]
    assert not (tmp_path / "nope").exists()  # a reader makes nothing


@pytest.mark.s3
def test_view_with_wrong_s3_keys_is_one_line(s3_endpoint):
    res = _view_cli(
        "--s3-endpoint", s3_endpoint.endpoint_url,
        env={"TRIALFLOW_S3_BUCKET": s3_endpoint.bucket, "TRIALFLOW_S3_ACCESS_KEY": "wrong", "TRIALFLOW_S3_SECRET_KEY": "wrong"},
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("error: cannot read the store (S3 ")
        and "Traceback" not in res.output
    )


async def test_a_multi_step_trial_shows_each_steps_session_and_verifier_output(tmp_path, serve):
    """Steps live under attempt-{n}/steps/{key}/ with an attempt's layout (trialflow.storage):
    one unit per step, each with its own trajectory, turns and verifier output."""
    from workflows.shared import StepResult

    store = make_store(tmp_path, lost_attempt=False)
    for key, out in [("0-build", "build ok"), ("1-test", "2 passed")]:
        keys = TrialKeys(BATCH, TRIAL, 1, key)
        store.put_bytes(keys.trajectory, make_trajectory().to_bytes())
        store.put_bytes(keys.log("verifier/stdout.txt"), out.encode())
    result = TrialResult.model_validate_json(store.get_bytes(trial_result_key(BATCH, TRIAL)))
    steps = [
        StepResult(name=n, reward=1.0, reward_valid=True, termination_reason="submitted")
        for n in ("build", "test")
    ]
    store.put_bytes(
        trial_result_key(BATCH, TRIAL),
        result.model_copy(update={"step_results": steps}).model_dump_json().encode(),
    )
    client = await serve(store)
    page = await _get(client, trial_url(TRIAL))
    assert 'id="steps"' in page and "attempt 1, step 0-build" in page and "attempt 1, step 1-test" in page
    build, test = page.split("attempt 1, step 0-build")[1].split("attempt 1, step 1-test")
    assert "build ok" in build and "2 passed" not in build and "2 passed" in test
    assert turn_url(TRIAL, 1, batch_id=BATCH, attempt=1, step="1-test").replace("&", "&amp;") in page
    turn = await _get(client, turn_url(TRIAL, 2, attempt=1, step="1-test"))
    assert "(attempt 1, step 1-test)" in turn
    assert "no attempt 1 step &#x27;9-x&#x27;" in await _get(client, turn_url(TRIAL, 1, step="9-x"), 404)


def test_view_serves_until_ctrl_c(tmp_path):
    """The command itself: one line with its address, pages served, Ctrl-C ends it quietly."""
    import signal
    import subprocess
    import sys
    import urllib.request

    make_store(tmp_path)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TRIALFLOW_S3")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from trialflow.cli import app; app()", "view", "--store-dir", str(tmp_path / "store"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**env, "COLUMNS": "300"},
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("trajectory viewer on http://127.0.0.1:"), line
        url = line.split()[3]
        with urllib.request.urlopen(url) as resp:
            assert resp.status == 200 and f"/batch/{BATCH}" in resp.read().decode()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in out, out


async def test_a_flood_of_logs_and_a_huge_answer_stay_bounded(tmp_path, serve):
    """An agent leaving 300 files in /logs/verifier, one of them 1 MiB, and a turn whose tool
    call is 1 MiB of text: the page shows the first LOGS_SHOWN files (the usual ones first),
    each a 64 KiB tail, names the rest, and cuts the answer with a note."""
    from trialflow.viewer._data import LOG_TAIL_BYTES, LOGS_SHOWN
    from trialflow.viewer._render import TEXT_CHARS

    traj = make_trajectory()
    traj.turns[0].answer["tool_calls"][0]["arguments"] = {"command": "x" * (1 << 20)}
    store = make_store(tmp_path, traj, lost_attempt=False)
    keys = TrialKeys(BATCH, TRIAL, 1)
    for i in range(300):
        store.put_bytes(keys.log(f"verifier/files/f{i:03d}.txt"), (b"y" * (1 << 20)) if i == 0 else b"z")
    page = await _get(await serve(store), trial_url(TRIAL))
    shown = re.findall(r'data-log="([^"]+)"', page)
    assert len(shown) == LOGS_SHOWN and shown[:2] == ["scaffold.log", "verifier/stdout.txt"]
    assert f"{300 + 2 - LOGS_SHOWN} more log files not shown" in page
    assert f"{(1 << 20) - LOG_TAIL_BYTES} earlier bytes left out" in page
    assert len(page) < LOGS_SHOWN * LOG_TAIL_BYTES + 200_000
    turn = await _get(await serve(store), turn_url(TRIAL, 1))
    assert "more characters; every token is on the segment page" in turn
    assert len(turn) < 2 * TEXT_CHARS + 400_000


async def test_the_index_is_paged(tmp_path, serve, monkeypatch):
    from trialflow.viewer import _data

    monkeypatch.setattr(_data, "BATCHES_PER_PAGE", 2)
    store = make_store(tmp_path)
    for b in ("b-2", "b-3"):
        store.put_bytes(trial_result_key(b, f"trial-{b}-x-0"), b"{}")
    client = await serve(store)
    first = await _get(client, "/")
    assert "batches 1-2 of 3" in first and 'href="/?offset=2"' in first
    last = await _get(client, "/?offset=2")
    assert "batches 3-3 of 3" in last and "b-3" in last and "next batches" not in last
    assert "no batches here" in await _get(client, "/?offset=9")
