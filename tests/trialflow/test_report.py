"""trialflow.report: one self-contained HTML page per batch."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from trialflow.report import render_report, reward_histogram_svg, write_report
from workflows.shared import TrialError, TrialResult

VOID = {"meta", "br", "img", "input", "hr", "link"}
SVG_LEAVES = {"rect", "line"}


class _Balance(HTMLParser):
    """Checks that every opened element is closed in order; collects text."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(doc: str) -> _Balance:
    p = _Balance()
    p.feed(doc)
    p.close()
    assert p.stack == [], p.stack
    return p


def _result(
    i: int, task: str, reward: float, valid: bool = True, termination: str = "submitted", **kw
) -> TrialResult:
    return TrialResult(
        trial_id=f"trial-b-{task}-{i}",
        batch_id="b",
        task_name=task,
        scaffold="oracle",
        sample_index=i,
        reward=reward,
        reward_valid=valid,
        termination_reason=termination,
        timings={"setup": 1.0 + i, "scaffold": 2.0 * (i + 1), "verify": 0.5},
        turns=i,
        **kw,
    )


def test_report_sections_numbers_and_well_formed_html():
    results = [
        _result(0, "create-file", 1.0),
        _result(1, "create-file", 1.0),
        _result(2, "fix-bug", 0.0),
        _result(
            3,
            "fix-bug",
            0.0,
            valid=False,
            termination="verifier_error",
            reward_error="RewardMissing: no file",
        ),
        _result(
            4,
            "slow",
            0.0,
            valid=False,
            termination="cancelled",
            error=TrialError(type="StragglerCancelled", message="cut <b>late</b> & slow", phase="pending"),
        ),
    ]
    doc = render_report(results, title="step 3", cancelled=["trial-b-slow-4"])
    p = _parse(doc)
    text = " ".join(p.text)
    assert "script" not in p.tags and not re.search(r"(src|href)=", doc)
    assert p.tags.count("svg") == 2  # histogram + phase box plot
    assert "mean reward (valid)" in text and "0.667" in text  # (1 + 1 + 0) / 3 valid
    assert "StragglerCancelled (pending)" in text and "cancelled (cut)" in text
    assert "RewardMissing" in text and "verifier_error" in text
    # the error message is escaped: its <b> is text, not markup
    assert "<b>late</b>" not in doc and "&lt;b&gt;late&lt;/b&gt; &amp; slow" in doc
    # phase table: setup over 5 trials has min 1.00 and max 5.00
    assert re.search(r"<td>setup</td><td class=\"num\">5</td><td class=\"num\">1.00</td>", doc)
    assert re.search(
        r"<td>create-file</td><td class=\"num\">2</td><td class=\"num\">2</td><td class=\"num\">1.000</td>",
        doc,
    )


def test_histogram_bins_and_clipping():
    svg = reward_histogram_svg([0.0, 0.05, 0.5, 1.0, 1.7, -0.2])
    _parse(svg)
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([0-9.]+)"', svg)]
    assert len(heights) == 10
    # bin 0: 0.0, 0.05, -0.2 (clipped) = 3; bin 5: 0.5; bin 9: 1.0, 1.7 (clipped) = 2
    assert heights[0] > heights[9] > heights[5] > 0 and heights[1:5] == [0.0] * 4
    assert [int(t) for t in re.findall(r">(\d+)</text>", svg)[:3]] == [3, 1, 2]


def test_empty_batch_renders(tmp_path):
    doc = render_report([], title="nothing")
    p = _parse(doc)
    assert "no trials" in " ".join(p.text) and "no valid rewards" in doc
    path = write_report(tmp_path / "r" / "report.html", [], title="nothing")
    assert path.read_text() == doc


def test_trajectory_state_follows_the_last_attempt():
    from trialflow.report import trajectory_state
    from trialflow.storage import AttemptRecord

    begun = AttemptRecord.begun(1, "file:///s/b/t/attempt-1")
    base = _result(0, "create-file", 1.0)
    states = [
        trajectory_state(base.model_copy(update={"attempt_records": records}))
        for records in ([], [begun.finished(None)], [begun.finished("file:///s/x.npz")], [begun])
    ]
    assert states == ["none", "none", "final", "partial"]
    assert ">partial<" in render_report([base.model_copy(update={"attempt_records": [begun]})], title="t")
