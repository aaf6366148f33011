"""Prompt groups and invalid trials: no false zero reaches a group estimator (no verl import).

verl's group estimators (``core_algos.compute_grpo_outcome_advantage``, Dr.GRPO, RLOO, ...)
take the mean (and std) of the scores of every sample that shares a ``uid``, masked or
not. An invalid trial (set-up failure, verifier crash, lost last attempt, cancelled
straggler) has no reward; whatever number stands in for it (``invalid_reward``) enters its
siblings' baseline: 3 successes + 1 invalid at 0.0 gives each success +0.5 instead of 0.
So the policy (`InvalidGroupPolicy`):

- ``"mask_group"`` (default): when any member of a prompt group is invalid, every member's
  response mask is zeroed (``masked_by="invalid_group"``). The group contributes nothing
  to the loss (verl's ``agg_loss`` skips fully masked rows in every mode), and no other
  group's advantages change (they are computed per ``uid``). This is what SkyRL's Harbor
  generator does. Cost: the valid members' tokens are not trained this step (counted in
  the step metrics under ``invalid_group``).
- ``"mask_member"``: only the invalid member is masked; its ``invalid_reward`` still enters
  the group's mean/std (the false zero). Kept for runs that must compare with older ones.

Where the group is seen:
- verl's classic trainer: `TemporalAgentLoopManager` sees the whole step batch after the
  workers return (a group can be split over two workers), and applies `groups_to_mask`.
- verl's v1 (TransferQueue) worker runs the ``n`` sessions of one prompt as tasks of one
  process, created together before any of them awaits, and puts each run's outputs into
  TransferQueue as it ends. `GroupGate` lets each run wait for its siblings' validity
  before it returns: every run joins the gate before its first await, so by the time any
  member's trial has ended, every sibling has joined.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

InvalidGroupPolicy = Literal["mask_group", "mask_member"]


def groups_to_mask(uids: Sequence[Hashable], valid: Sequence[bool]) -> list[bool]:
    """Per row: True when the row's group (rows with an equal uid) has an invalid member."""
    if len(uids) != len(valid):
        raise ValueError(f"{len(uids)} uids, {len(valid)} validity flags")
    spoiled = {u for u, ok in zip(uids, valid, strict=True) if not ok}
    return [u in spoiled for u in uids]


@dataclass
class _Group:
    joined: int = 0
    reports: list[bool] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class GroupMember:
    """One run's place in its group: `settle` exactly once (`abandon` on failure)."""

    def __init__(self, gate: GroupGate, key: Hashable, group: _Group) -> None:
        self._gate, self._key, self._group = gate, key, group
        self._settled = False

    def _report(self, valid: bool) -> None:
        if self._settled:
            raise RuntimeError("a group member settles once")
        self._settled = True
        self._group.reports.append(valid)
        if len(self._group.reports) == self._group.joined:
            self._group.done.set()
            if self._gate._open.get(self._key) is self._group:
                del self._gate._open[self._key]  # a later run with this key starts a new group

    async def settle(self, valid: bool) -> bool:
        """Report this member's validity, wait for every sibling's; True when all were valid."""
        self._report(valid)
        await self._group.done.wait()
        return all(self._group.reports)

    def abandon(self) -> None:
        """This run failed before it could settle: its siblings see it as invalid."""
        if not self._settled:
            self._report(False)


class GroupGate:
    """Prompt groups of one process and event loop (see the module docstring)."""

    def __init__(self) -> None:
        self._open: dict[Hashable, _Group] = {}

    def join(self, key: Hashable) -> GroupMember:
        """Join the open group of ``key`` (call before the run's first await)."""
        group = self._open.setdefault(key, _Group())
        group.joined += 1
        return GroupMember(self, key, group)
