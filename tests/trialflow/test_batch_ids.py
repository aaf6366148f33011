"""Trial ids are unique per task path, not per basename (issue 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialflow.batch import TrialIdCollision, check_unique_ids, make_specs, task_labels


def _dirs(tmp_path: Path, *rels: str) -> list[Path]:
    out = []
    for rel in rels:
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        out.append(tmp_path / rel)
    return out


def test_distinct_basenames_keep_their_names(tmp_path):
    assert task_labels(_dirs(tmp_path, "x/alpha", "y/beta")) == ["alpha", "beta"]


def test_same_basename_gets_the_shortest_unique_suffix(tmp_path):
    paths = _dirs(tmp_path, "suite-a/fix-bug", "suite-b/fix-bug", "other")
    assert task_labels(paths) == ["suite-a/fix-bug", "suite-b/fix-bug", "other"]
    specs = make_specs("b1", paths, "oracle", samples=2)
    ids = [s.trial_id for s in specs]
    assert len(set(ids)) == 6
    assert ids[0] == "trial-b1-suite-a_fix-bug-0" and ids[2] == "trial-b1-suite-b_fix-bug-0"


def test_deeper_clash_takes_more_parts(tmp_path):
    paths = _dirs(tmp_path, "r1/set/t", "r2/set/t")
    assert task_labels(paths) == ["r1/set/t", "r2/set/t"]


def test_names_equal_only_after_id_sanitising_are_told_apart(tmp_path):
    # "a b" and "a_b" both become "a_b" in a workflow id.
    paths = _dirs(tmp_path, "p/a b", "q/a_b")
    labels = task_labels(paths)
    assert labels == ["p/a b", "q/a_b"]
    assert len({s.trial_id for s in make_specs("b", paths, "nop")}) == 2


def test_same_directory_twice_is_refused(tmp_path):
    (d,) = _dirs(tmp_path, "t")
    with pytest.raises(TrialIdCollision, match="given twice"):
        make_specs("b", [d, tmp_path / "t" / ".." / "t"], "nop")


def test_check_unique_ids_refuses_clashing_specs(tmp_path):
    a, b = _dirs(tmp_path, "a/t", "b/t")
    first = make_specs("b", [a], "nop")[0]
    second = first.model_copy(update={"task_path": str(b)})
    with pytest.raises(TrialIdCollision, match="both"):
        check_unique_ids([first, second])
    check_unique_ids([first, first.model_copy()])  # the same trial twice is one trial
