"""`nop`: does nothing. The baseline every task must fail (its verifier gives reward 0)."""

from __future__ import annotations

from trialflow.scaffolds.base import Scaffold, ScaffoldContext, ScaffoldResult


class NopScaffold(Scaffold):
    name = "nop"
    needs_model = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        return ScaffoldResult(exit_code=0, timed_out=False, stdout="", stderr="", duration_s=0.0)
