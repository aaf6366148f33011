"""test.sh's command line and environment (pure)."""

from trialflow.sandbox.toolchain import BUSYBOX, DEFAULT_PATH
from trialflow.verifier_env import verifier_command


def test_unsafe_variables_are_unset_path_reset_and_the_tasks_env_on_top():
    base = {
        "PATH": "/opt/x/bin:/usr/bin",
        "LD_LIBRARY_PATH": "/evil",
        "BASH_FUNC_ls%%": "() { :; }",
        "LANG": "C",
    }
    argv = verifier_command("/tests/test.sh", True, base, {"TOKEN": "t", "LD_PRELOAD": "/ok.so"})
    assert argv[:2] == [BUSYBOX, "env"] and argv[-1] == "/tests/test.sh"
    unset = {argv[i + 1] for i, a in enumerate(argv) if a == "-u"}
    assert {"LD_LIBRARY_PATH", "BASH_FUNC_ls%%", "BASH_ENV", "ENV"} <= unset
    assert "LANG" not in unset and "LD_PRELOAD" not in unset  # [verifier].env is the author's
    assert "PATH=/opt/x/bin:/usr/bin" in argv and "TOKEN=t" in argv and "LD_PRELOAD=/ok.so" in argv


def test_no_shebang_runs_under_bin_bash_and_no_path_gets_the_standard_one():
    argv = verifier_command("/tests/test.sh", False, {}, {})
    assert argv[-2:] == ["/bin/bash", "/tests/test.sh"] and f"PATH={DEFAULT_PATH}" in argv
