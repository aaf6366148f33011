"""Pins the public surface of trialflow.verl; the verl-free part must not import verl."""

import subprocess
import sys

import trialflow.verl as tv


def test_exports():
    assert sorted(tv.__all__) == sorted(
        [
            "ConversionError",
            "ConvertConfig",
            "ConvertedTrial",
            "LoopSample",
            "StepBatch",
            "StepTrial",
            "StragglerPolicy",
            "convert_trial",
            "extra_fields",
            "load_trajectory",
            "loop_metrics",
            "run_step",
            "step_metrics",
            "LoopConfig",
            "ReplicaDiscoveryError",
            "SampleIdentity",
            "TemporalAgentLoop",
            "TemporalAgentLoopManager",
            "TrialIdentityError",
            "TrialRow",
            "UnsupportedTrainer",
            "check_trainer",
            "resolve_identity",
            "stamp_identity",
            "verl_replica_urls",
        ]
    )
    assert all(hasattr(tv, name) for name in tv.__all__)  # the agent-loop names load verl here


def test_step_batch_and_convert_load_without_verl():
    code = "import sys, trialflow.verl; assert 'verl' not in sys.modules, 'verl imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
