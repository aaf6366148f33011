"""`outcome_of` (pure): how a scaffold's ending maps onto the trial's termination."""

from __future__ import annotations

from activities.scaffold import outcome_of
from trialflow.scaffolds import ScaffoldResult


def _result(
    exit_code: int = 0,
    *,
    timed_out: bool = False,
    stop_reason=None,
    stderr: str = "",
    detail: str | None = None,
) -> ScaffoldResult:
    return ScaffoldResult(exit_code, timed_out, "", stderr, 1.0, stop_reason=stop_reason, detail=detail)


def test_clean_exit_is_submitted():
    assert outcome_of(_result(0), attempt=1) == ("submitted", None)


def test_turn_limit_is_an_outcome_not_a_scaffold_error():
    assert outcome_of(_result(1, stop_reason="max_turns"), attempt=2) == ("max_turns", None)


def test_a_turn_the_session_refused_at_its_limit_is_max_turns_whatever_the_exit():
    """The CLI fails on the proxy's 400 (exit 1) or ends on its own after it (exit 0)."""
    for code in (0, 1):
        assert outcome_of(_result(code, stderr="API error\n"), 1, turn_limited=True) == ("max_turns", None)


def test_nonzero_exit_without_a_stop_reason_is_a_scaffold_error_with_the_stderr_tail():
    termination, error = outcome_of(_result(3, stderr="a\nb\nc\nd\n"), attempt=2)
    assert termination == "scaffold_error"
    assert error is not None and (error.type, error.phase, error.attempt) == ("ScaffoldExit", "scaffold", 2)
    assert error.message == "scaffold exited with code 3: b | c | d"


def test_scaffold_error_message_leads_with_the_agents_own_detail():
    _, error = outcome_of(_result(1, detail="API Error: output token maximum", stderr="x\n"), attempt=1)
    assert (
        error is not None
        and error.message == "scaffold exited with code 1: API Error: output token maximum | x"
    )
    _, bare = outcome_of(_result(1), attempt=1)
    assert bare is not None and bare.message == "scaffold exited with code 1"


def test_timeout_and_overlong_win_over_the_turn_limit():
    assert outcome_of(_result(124, timed_out=True, stop_reason="max_turns"), 1) == ("timeout", None)
    assert outcome_of(_result(1, stop_reason="max_turns"), 1, overlong=True) == ("overlong", None)
    assert outcome_of(_result(1), 1, overlong=True) == ("overlong", None)
    assert outcome_of(_result(124, timed_out=True), 1, turn_limited=True) == ("timeout", None)
    assert outcome_of(_result(1), 1, overlong=True, turn_limited=True) == ("overlong", None)


def test_infrastructure_the_agent_saw_is_never_the_agents_outcome():
    """`infra_cause`: any infrastructure error the agent saw, whatever it did next (exit 0 or
    not); a timeout in an attempt whose turns were held for an outage; the old rule (failed
    while every replica is down). A clean attempt, and a held turn without a timeout, are the
    agent's own."""
    from activities.scaffold import infra_cause
    from proxy.trajectory import Counters

    assert infra_cause(Counters(infra_errors=2), timed_out=False, replicas_down=False) == (
        "the agent saw 2 infrastructure errors (no replica could serve its turn)"
    )
    assert "timed out" in (infra_cause(Counters(outage_holds=1), timed_out=True, replicas_down=False) or "")
    assert infra_cause(Counters(outage_holds=1), timed_out=False, replicas_down=False) is None
    assert infra_cause(Counters(), timed_out=True, replicas_down=False) is None
    assert infra_cause(None, timed_out=False, replicas_down=False) is None
    assert (
        infra_cause(Counters(), timed_out=False, replicas_down=True)
        == "the agent failed while no replica answered"
    )
