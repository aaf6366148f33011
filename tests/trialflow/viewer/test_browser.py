"""`trialflow view` in a real browser over a real trial.

The trial: real Temporal, Docker, SeaweedFS and two `python worker_main.py` processes, the
scripted vLLM double as the model (tests/test_resume_replay.py's rig and tool-loop scaffold),
a task whose tool output carries a seed file. The model's shell calls echo agent-written markup
(``<script>``, an ``<img onerror>``) into the tool call and its output. Worker 1 is SIGKILLed at
turn K, so attempt 1 is lost (its checkpoints) and attempt 2 replays turns 1..K-1 and generates
the rest; then the seed file changes and ``replay --from-record`` diverges, keeping its report.

Then chromium (selenium + chromium-driver) opens the viewer: batches -> batch -> trial -> turn
-> segment, checking what is visible (reward, replayed/generated badges, the lost attempt, the
resume note, the verifier's output, the replay diff, the Temporal UI link, the tool call, the
decoded tokens), that the agent's markup stayed text (no script ran: the page title and DOM are
as rendered), and screenshots: the viewport's size, not blank, and the pixel colour of a mask-0
token (blue) against a mask-1 token (green: the double's logprobs are -0.01..-0.5).
Screenshots go to $TRIALFLOW_VIEWER_SCREENSHOTS when set (docs/viewer-*.png came from there).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from tests._browser import chromium, distinct_colours, dominant_colour, image
from tests.doubles.scripted_vllm import Reply
from tests.test_resume_replay import K, Model, N, _crash_at_k, rig, seeded_task  # noqa: F401  (rig: the fixture)

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]

MARKUP = "<script>document.title=1</script><img src=x onerror=document.title=2>"
WIDTH, HEIGHT = 1280, 900


class MarkupModel(Model):
    """The rig's model, whose shell calls also echo markup and read the seed file."""

    def __call__(self, prompt: str) -> Reply:
        h = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        command = (
            f"printf 'Hello, trialflow!\\\\n' > /app/hello.txt; echo {h} >> /tmp/steps; "
            f"cat /app/data/seed.txt; echo '{MARKUP}'; wc -l < /tmp/steps"
        )
        return self._reply(
            f'<tool_call>\n{{"name": "shell", "arguments": {{"command": "{command}"}}}}\n</tool_call>'
        )


async def test_batch_trial_turn_in_chromium(rig, tmp_path, tiny_model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    from trialflow.cli._record import replay_record
    from trialflow.viewer._server import Viewer, start

    rig.model = rig.dbl.default = MarkupModel()
    task, seed = seeded_task(tmp_path)
    spec, result, _, _ = await _crash_at_k(rig, rig.start("first"), "viewed", task=task)
    assert (result.error, result.attempts, result.reward) == (None, 2, 1.0)
    assert (result.replayed_turns, result.generated_turns) == (K - 1, N - K + 1)
    await rig.dbl.stop()
    seed.write_text("beta\n")  # the environment changed: a re-run from the record diverges at request 1
    code = await asyncio.to_thread(replay_record, rig.settings, spec.trial_id, attempt=None, task=None)
    assert code == 1

    viewer = Viewer(
        rig.store,
        "the test's S3",
        "http://127.0.0.1:8233",
        tokenizer=AutoTokenizer.from_pretrained(str(tiny_model_dir)),
    )
    runner, port = await start(viewer, "127.0.0.1", 0)
    shots = Path(os.environ.get("TRIALFLOW_VIEWER_SCREENSHOTS") or tmp_path / "shots")
    await asyncio.to_thread(shots.mkdir, parents=True, exist_ok=True)
    try:  # selenium blocks: it runs in a thread while this loop serves the viewer
        await asyncio.to_thread(_browse, f"http://127.0.0.1:{port}", spec.trial_id, shots)
    finally:
        await runner.cleanup()


def _browse(base: str, trial_id: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    with chromium(WIDTH, HEIGHT) as d:

        def shot(name: str) -> bytes:
            png = d.get_screenshot_as_png()
            (shots / f"viewer-{name}.png").write_bytes(png)
            assert image(png).size == (WIDTH, d.execute_script("return window.innerHeight")), name
            assert distinct_colours(png) > 20, f"{name}: blank screenshot"
            return png

        def untouched(title_start: str) -> None:
            """No agent-written script ran and none is in the DOM."""
            assert d.title.startswith(title_start), d.title
            assert d.execute_script("return document.scripts.length + document.images.length") == 0

        d.get(f"{base}/")
        shot("index")
        d.find_element(By.LINK_TEXT, "viewed").click()
        assert d.current_url.endswith("/batch/viewed")
        row = d.find_element(By.ID, "trials").text
        assert trial_id in row and "1.000" in row and f"{K - 1} / {N - K + 1}" in row
        shot("batch")

        d.find_element(By.LINK_TEXT, trial_id).click()
        untouched(f"trial {trial_id}")
        summary = d.find_element(By.ID, "summary").text
        assert "1.000" in summary and "submitted" in summary and f"{N}: {K - 1} / {N - K + 1}" in summary
        link = d.find_element(By.ID, "temporal-link")
        assert link.get_attribute("href") == f"http://127.0.0.1:8233/namespaces/default/workflows/{trial_id}"
        body = d.find_element(By.TAG_NAME, "body").text
        assert f"lost attempt: rebuilt from {K - 1} checkpoints" in body
        resume = d.find_element(By.CSS_SELECTOR, "p.resume").text
        assert resume.startswith(
            f"resumed: replayed {K - 1} of {K - 1} recorded turns; live from turn {K} on (record ended)"
        ), resume
        assert "the main thread's first request" in body
        turns = d.find_elements(By.CSS_SELECTOR, "table.turns")[-1]  # attempt 2's
        badges = [b.text for b in turns.find_elements(By.CLASS_NAME, "badge")]
        assert badges == ["replayed"] * (K - 1) + ["generated"] * (N - K + 1)
        assert "shell" in turns.text
        verifier = d.find_elements(By.CSS_SELECTOR, 'pre[data-log="verifier/stdout.txt"]')[-1]
        assert verifier.text == "PASS: content matches"
        diff = d.find_element(By.CSS_SELECTOR, "pre.diff")
        assert "request 1 differs from recorded turn 1" in diff.text
        dels = [e.text for e in diff.find_elements(By.CLASS_NAME, "del")]
        adds = [e.text for e in diff.find_elements(By.CLASS_NAME, "add")]
        assert "-alpha" in dels and "+beta" in adds, (dels, adds)
        shot("trial")

        turns = d.find_elements(By.CSS_SELECTOR, "table.turns")[-1]
        turns.find_element(By.LINK_TEXT, str(K)).click()  # the first generated turn
        untouched(f"turn {K} of {trial_id}")
        calls = d.find_element(By.ID, "tool-calls").text
        assert "shell" in calls and MARKUP in calls  # shown as text, not run
        env = d.find_element(By.ID, "env")  # turn K-1's tool output (mask 0), decoded
        assert "alpha" in env.text and MARKUP in env.text
        assert {s.get_attribute("data-mask") for s in env.find_elements(By.CSS_SELECTOR, "span")} == {"0"}
        generated = d.find_element(By.ID, "generated")
        gen_spans = generated.find_elements(By.CSS_SELECTOR, "span")
        assert gen_spans and {s.get_attribute("data-mask") for s in gen_spans} == {"1"}
        assert "logprob -0." in gen_spans[0].get_attribute("title")
        assert "<tool_call>" in generated.text
        shot("turn")
        d.execute_script("arguments[0].scrollIntoView()", d.find_element(By.XPATH, "//h2[text()='tokens']"))
        shot("turn-tokens")
        env_colour = dominant_colour(env.find_elements(By.CSS_SELECTOR, "span")[0].screenshot_as_png)
        gen_colour = dominant_colour(gen_spans[0].screenshot_as_png)
        r, g, b = env_colour
        assert b > r + 30 and b > g, f"mask 0 token not blue: {env_colour}"
        r, g, b = gen_colour
        assert g > b + 40 and g > r, f"mask 1 token (logprob near 0) not green: {gen_colour}"

        d.find_element(By.PARTIAL_LINK_TEXT, "0 (main)").click()
        untouched(f"segment 0 of {trial_id}")
        shot("segment")
        marks = []
        while True:  # every turn starts in the segment once, over its pages
            marks += [m.text for m in d.find_elements(By.CLASS_NAME, "turnmark")]
            more = d.find_elements(By.LINK_TEXT, "next tokens")
            if not more:
                break
            more[0].click()
        assert marks == [f"turn {n}" for n in range(1, N + 1)]
