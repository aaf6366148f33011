"""Admission: how many trials may hold a sandbox, and how many may be in their model phase,
on this worker (docs/admission.md).

- `Gate`, `SandboxSlots` (trialflow.admission._gate): the counting limits and the Temporal slot
  supplier that makes the set-up queue poll only while the host has room;
- `Admission` (._runtime): one worker's gates and sandbox leases.
"""

from trialflow.admission._gate import Gate, SandboxSlots
from trialflow.admission._runtime import Admission

__all__ = ["Admission", "Gate", "SandboxSlots"]
