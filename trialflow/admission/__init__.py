"""Admission: how many trials may hold a sandbox, and how many may be in their model phase,
on this worker (docs/admission.md).

- `Gate`, `SandboxSlots` (._gate): the counting limits, and the Temporal slot supplier that
  makes the set-up queue poll only while the host has room for one more sandbox;
- `step`, `Policy`, `Signals`, `State`, ... (._control): the controller, pure;
- `Sensors`, `StartStats` (._signals): the I/O that reads the signals;
- `Admission` (._runtime): one worker's gates, leases and controller loop;
- `AdmissionReport` (._report): a worker's admission as `trialflow status` shows it.
"""

from trialflow.admission._control import (
    Binding,
    Mark,
    Policy,
    Pressure,
    ReplicaSignals,
    SandboxSignals,
    Signals,
    State,
    Usage,
    step,
)
from trialflow.admission._gate import Gate, SandboxSlots
from trialflow.admission._report import AdmissionReport, admission_key, read_reports
from trialflow.admission._runtime import Admission
from trialflow.admission._signals import Sensors, StartStats

__all__ = [
    "Admission",
    "AdmissionReport",
    "Binding",
    "Gate",
    "Mark",
    "Policy",
    "Pressure",
    "ReplicaSignals",
    "SandboxSignals",
    "SandboxSlots",
    "Sensors",
    "Signals",
    "StartStats",
    "State",
    "Usage",
    "admission_key",
    "read_reports",
    "step",
]
