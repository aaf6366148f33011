"""What a separate verifier environment (issue 13) and the shared mode's verification restart
(issue 20) cost per verification, measured in one run on one Docker engine.

The same task twice (written to a temp dir, FROM trialflow-base:bookworm): the agent writes
/app/out.txt; test.sh compares it with an expected file. ``stop_processes``: the shared
verification before issue 20 (`Sandbox.stop_processes`, which spares the keep-alive, then
`run_tests`). ``shared``: `run_verifier` in the agent's sandbox (the verification restart:
every process killed, the container started again with the toolchain's keep-alive; tests
uploaded, test.sh run, rewards read). ``separate``:
`verify_separately` (stop_processes, the artifact copied out, a fresh verifier sandbox
from tests/Dockerfile created and started, the artifact put in, test.sh run, the verifier
sandbox removed). The agent sandbox's own set-up and teardown are outside both timings.
Alternating, after one warm-up of each (which also builds the images).

    .venv/bin/python bench/separate_verifier.py [--trials 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TEST_SH = "#!/bin/bash\nif cmp -s /app/out.txt /tests/expected.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"


def _write(root: Path, separate: bool) -> Path:
    files = {
        "task.toml": 'artifacts = ["/app/out.txt"]\n[environment]\nworkdir = "/app"\n'
        + ("[verifier.environment]\ncpus = 1\n" if separate else ""),
        "instruction.md": "Write /app/out.txt.\n",
        "environment/Dockerfile": "FROM trialflow-base:bookworm\nWORKDIR /app\n",
        "tests/test.sh": TEST_SH,
        "tests/expected.txt": "done\n",
    }
    if separate:
        files["tests/Dockerfile"] = "FROM trialflow-base:bookworm\nCOPY test.sh expected.txt /tests/\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


async def main(trials: int) -> dict:
    import docker

    from trialflow.sandbox import DockerBackend
    from trialflow.separate_verifier import verify_separately
    from trialflow.tasks import load_task
    from trialflow.verifier import run_tests, run_verifier

    backend = DockerBackend(
        docker.from_env(), labels={"trialflow.bench": f"sepverify-{uuid.uuid4().hex[:6]}"}
    )
    with tempfile.TemporaryDirectory(prefix="tf-bench-sv-") as tmp:
        shared = load_task(_write(Path(tmp) / "shared", False))
        tasks = {
            "stop_processes": shared,
            "shared": shared,
            "separate": load_task(_write(Path(tmp) / "separate", True)),
        }
        times: dict[str, list[float]] = {mode: [] for mode in tasks}
        for i in range(trials + 1):
            for mode, task in tasks.items():
                agent = await backend.create(task, trial_id=f"bench-{mode}-{i}")
                try:
                    await agent.start()
                    assert (await agent.exec("echo done > /app/out.txt")).ok
                    t0 = time.perf_counter()
                    if mode == "stop_processes":
                        await agent.stop_processes()
                        result = await run_tests(agent, task, agent_sandbox=True)
                    elif mode == "shared":
                        result = await run_verifier(agent, task)
                    else:
                        out = Path(tmp) / f"art-{i}"
                        result = (
                            await verify_separately(backend, agent, task, trial_id="bench", artifacts_dir=out)
                        ).result
                    elapsed = time.perf_counter() - t0
                    assert result.reward == 1.0, result
                    if i > 0:  # the first round warms up (and builds the images)
                        times[mode].append(elapsed)
                finally:
                    await agent.stop()
    med = {mode: statistics.median(v) for mode, v in times.items()}
    return {
        "trials": trials,
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "min_s": {k: round(min(v), 3) for k, v in times.items()},
        "separate_minus_shared_s": round(med["separate"] - med["shared"], 3),
        "ratio": round(med["separate"] / med["shared"], 2),
        "restart_minus_stop_processes_s": round(med["shared"] - med["stop_processes"], 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    print(json.dumps(asyncio.run(main(parser.parse_args().trials)), indent=1))
