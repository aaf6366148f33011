"""docs/verl.md's command lines, composed with verl 0.9.1's REAL hydra config exactly as
``python -m verl.trainer.main_ppo`` composes them (the ``+`` prefixes matter), then the
start-up path each trainer takes with them: v1 picks its trainer class by mode and needs no
manager class; the classic trainer loads our manager by name, which checks every
``TemporalAgentLoop`` entry of the YAML before a trial runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trialflow.verl.agent_loop import TemporalAgentLoopManager, UnsupportedTrainer, trainer_kind

REPO = Path(__file__).resolve().parents[2]


def _command(name: str) -> list[str]:
    """The hydra overrides of the fenced block after ``<!-- command:NAME ... -->``."""
    text = (REPO / "docs" / "verl.md").read_text()
    block = re.search(rf"<!-- command:{name}\b[^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert block, f"docs/verl.md has no command:{name} block"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    return argv[3:]


def _compose(overrides: list[str], tiny_model_dir):
    import verl
    from hydra import compose, initialize_config_dir

    # paths in the docs are relative to the repository root, as a user runs them from it
    overrides = [o.replace("examples/", f"{REPO}/examples/") for o in overrides]
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        return compose(
            config_name="ppo_trainer",
            overrides=[*overrides, f"actor_rollout_ref.model.path={tiny_model_dir}"],
        )


def test_v1_command(tiny_model_dir):
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.import_utils import load_class_from_fqn

    cfg = _compose(_command("v1"), tiny_model_dir)
    assert trainer_kind(cfg) == "v1" and cfg.trainer.use_v1
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode)  # what TaskRunnerV1.run does first
    assert not cfg.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")  # v1's own TQ manager
    cls = load_class_from_fqn(
        cfg.actor_rollout_ref.rollout.checkpoint_manager_class, "CheckpointEngineManager"
    )
    assert cls.__name__ == "TemporalCheckpointEngineManager"
    # our manager class would replace v1's: it refuses
    with pytest.raises(UnsupportedTrainer):
        TemporalAgentLoopManager.check_config(cfg)


def test_classic_command(tiny_model_dir):
    from verl.utils.import_utils import load_class_from_fqn

    cfg = _compose(_command("classic"), tiny_model_dir)
    assert trainer_kind(cfg) == "classic"
    cls = load_class_from_fqn(
        cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager"
    )
    assert cls is TemporalAgentLoopManager
    loops = cls.check_config(cfg)  # the YAML's entries, checked against the classic trainer
    assert [(lc.side_segments, lc.rewritten_segments, lc.step_segments) for lc in loops] == [("drop",) * 3]
    # the default YAML (every segment trains) is refused under the classic trainer, saying what to change
    default_yaml = [o.replace("agent_loop_classic.yaml", "agent_loop.yaml") for o in _command("classic")]
    with pytest.raises(UnsupportedTrainer, match="side_segments: drop"):
        cls.check_config(_compose(default_yaml, tiny_model_dir))


def test_without_the_plus_hydra_refuses_the_manager_key(tiny_model_dir):
    from hydra.errors import ConfigCompositionException

    bare = [o.lstrip("+") for o in _command("classic")]
    with pytest.raises(ConfigCompositionException):
        _compose(bare, tiny_model_dir)
