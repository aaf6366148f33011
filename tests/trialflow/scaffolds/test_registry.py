import pytest

from trialflow.errors import UnknownScaffold
from trialflow.scaffolds import (
    Scaffold,
    ScaffoldContext,
    ScaffoldResult,
    available_scaffolds,
    get_scaffold,
)
from trialflow.scaffolds.registry import register_scaffold, scaffold_class


def test_registered_names():
    assert {"oracle", "nop", "claude-code", "opencode", "terminus"} <= set(available_scaffolds())


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(KeyError) as exc:
        get_scaffold("gpt-engineer")
    assert isinstance(exc.value, UnknownScaffold)
    for name in ("oracle", "nop", "claude-code", "opencode", "terminus"):
        assert name in str(exc.value)


@pytest.mark.parametrize("name", ["oracle", "nop"])
def test_builtins(name):
    sc = get_scaffold(name)
    assert isinstance(sc, Scaffold) and sc.name == name and sc.needs_model is False
    assert tuple(sc.mounts()) == ()


class _Echo(Scaffold):
    """A small fake scaffold: proves registration and the options path."""

    name = "echo"

    def __init__(self, word: str = "hi") -> None:
        self.word = word

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        return ScaffoldResult(0, False, self.word, "", 0.0)


def test_register_with_options():
    register_scaffold("echo-test", f"{__name__}:_Echo")
    assert scaffold_class("echo-test") is _Echo
    assert get_scaffold("echo-test", word="yo").word == "yo"
    with pytest.raises(ValueError):
        register_scaffold("bad", "no-colon")
    register_scaffold("not-a-scaffold", "builtins:dict")
    with pytest.raises(TypeError):
        get_scaffold("not-a-scaffold")


def test_result_log_joins_streams():
    assert ScaffoldResult(0, False, "out", "", 1.0).log == "out"
    assert ScaffoldResult(1, False, "out", "err", 1.0).log == "out\n--- stderr ---\nerr"
