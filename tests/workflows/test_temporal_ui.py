"""The Temporal UI tells a trial's story: REAL Temporal (with its UI), Docker and SeaweedFS,
an in-process worker, and the UI looked at in a real browser (Debian's headless chromium
driven by selenium through chromium-driver: tests/_browser.py).

Three trials: oracle on create-file (reward 1), nop on create-file (reward 0, still a valid
outcome) and oracle on verifier-error (the verifier writes no reward: invalid). Each has its
static summary and details (task, scaffold, sample, the inspect / replay commands, the
viewer link), the final current details (reward, termination, turns, tokens, where the
records are), its TrialOutcome search attribute, and the query `trialflow run` prints for
"invalid or errored" lists exactly the invalid one. In the browser, the trial page shows the
summary, the details and the current details, and the saved-view query's list shows the
invalid trial only. ``TRIALFLOW_UI_SCREENSHOTS=DIR`` keeps the screenshots (docs/ui.md's).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.common import SearchAttributeKey

from tests._worker_fixtures import worker_settings
from trialflow import batch, trial_details
from trialflow.cli._worker import WorkerProcess
from trialflow.viewer import trial_url
from workflows.shared import SA_OUTCOME

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


@pytest.fixture(scope="module")
def temporal_ui(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A Temporal dev server of this module's own with its UI: (address, UI base URL)."""
    from infra import free_port, start_temporal

    ui_port = free_port()
    service = start_temporal(tmp_path_factory.mktemp("temporal-ui"), ui_port=ui_port)
    yield service.endpoint, f"http://127.0.0.1:{ui_port}"
    service.stop()


@pytest.fixture(scope="module")
async def trials(temporal_ui, s3_endpoint, docker_client):
    address, ui = temporal_ui
    settings = worker_settings("ui", address, s3_endpoint, docker_client)
    client = await batch.connect(address)
    specs = [
        *batch.make_specs(
            settings.task_queue, [TASKS / "create-file"], "oracle", viewer_url="http://viewer:1"
        ),
        *batch.make_specs(settings.task_queue, [TASKS / "create-file"], "nop", viewer_url="http://viewer:1"),
        *batch.make_specs(
            settings.task_queue, [TASKS / "verifier-error"], "oracle", viewer_url="http://viewer:1"
        ),
    ]
    specs = [s.model_copy(update={"sample_index": i}) for i, s in enumerate(specs)]
    async with WorkerProcess(settings, client) as worker:
        results = await batch.run(client, specs, task_queue=settings.task_queue)
        metadata = []
        for spec in specs:  # the current details are a query: answered while a worker runs
            handle = client.get_workflow_handle(spec.trial_id)
            metadata.append(await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata))
        yield client, ui, specs, results, metadata, worker


async def test_every_trial_says_what_it_is_and_how_it_went(trials):
    client, _, specs, results, metadata, _ = trials
    assert [r.reward_valid for r in results] == [True, True, False]
    for spec, result, meta in zip(specs, results, metadata, strict=True):
        desc = await client.get_workflow_handle(spec.trial_id).describe()
        assert await desc.static_summary() == f"{spec.scaffold} on {spec.task_name} #{spec.sample_index}"
        details = await desc.static_details()
        assert f"**task** `{spec.task_name}`" in details and f"**scaffold** `{spec.scaffold}`" in details
        assert f"`trialflow inspect {spec.trial_id}`" in details
        assert f"`trialflow replay {spec.trial_id} --from-record --model-dir DIR`" in details
        assert f"({trial_url(spec.trial_id, 'http://viewer:1', spec.batch_id)})" in details
        current = meta.current_details
        assert current.startswith(f"### reward {result.reward:.3f}"), current
        assert f"· {result.termination_reason}" in current and "generated tokens" in current
        assert f"result: `{result.result_uri}`" in current
        outcome = desc.typed_search_attributes.get(SearchAttributeKey.for_keyword(SA_OUTCOME))
        assert outcome == trial_details.outcome(result)
    assert [trial_details.outcome(r) for r in results] == ["ok", "ok", "invalid"]
    assert "(**invalid**: RewardMissing: test\\.sh wrote neither" in metadata[2].current_details


async def test_the_failing_query_lists_the_invalid_trial_only(trials):
    client, _, specs, _, _, _ = trials
    query = trial_details.failing_query(specs[0].batch_id)
    deadline = time.monotonic() + 30  # visibility is eventually consistent
    while True:
        listed = [wf.id async for wf in client.list_workflows(query=query)]
        if listed or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert listed == [specs[2].trial_id]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from tests._browser import chromium

    with chromium(1500, 1150) as driver:
        yield driver


def _shot(driver, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("TRIALFLOW_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(folder / f"temporal-ui-{name}.png"))


def _page_text(driver) -> str:
    """The page's visible text, with that of its frames (the UI renders markdown, the user
    metadata, in an iframe each)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    texts = [driver.find_element(By.TAG_NAME, "body").text]
    for frame in driver.find_elements(By.TAG_NAME, "iframe"):
        try:
            driver.switch_to.frame(frame)
            texts.append(driver.find_element(By.TAG_NAME, "body").text)
        except WebDriverException:  # a frame replaced while read (the UI refreshes it)
            pass
        finally:
            driver.switch_to.default_content()
    return "\n".join(texts)


def _wait_for_text(driver, *texts: str, timeout_s: float = 60) -> str:
    """The page's visible text once it holds every one of ``texts`` (the UI renders late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = _page_text(driver)
        if all(t in body for t in texts):
            return body
        if time.monotonic() > deadline:
            Path("/tmp/ui-page.html").write_text(driver.page_source)
            raise AssertionError(f"the page never showed {texts!r}; it shows:\n{body[:3000]}")
        time.sleep(0.25)


def _open_section(driver, title: str) -> None:
    """Click a collapsed section of the workflow page open (the UI folds "User Metadata")."""
    from selenium.webdriver.common.by import By

    _wait_for_text(driver, title)
    (toggle,) = [
        e
        for e in driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{title}']")
        if e.is_displayed()
    ][:1]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click();", toggle)


async def test_the_ui_shows_the_details_in_a_browser(trials, browser, tmp_path):
    _, ui, specs, results, _, _ = trials
    # in a thread: this loop runs the worker, which answers the UI's current-details query
    await asyncio.to_thread(_browse, browser, ui, specs, results, tmp_path)


def _browse(browser, ui: str, specs, results, tmp_path: Path) -> None:
    ok, invalid = specs[0], specs[2]
    browser.get(f"{ui}/namespaces/default/workflows/{ok.trial_id}")
    _open_section(browser, "User Metadata")
    _wait_for_text(
        browser,
        trial_details.summary(ok),
        f"trialflow inspect {ok.trial_id}",
        f"reward {results[0].reward:.3f} (valid)",
    )
    _shot(browser, "trial", tmp_path)
    browser.get(trial_details.workflows_ui_url(trial_details.failing_query(ok.batch_id), ui))
    body = _wait_for_text(browser, invalid.trial_id)
    assert ok.trial_id not in body and specs[1].trial_id not in body
    _shot(browser, "failing", tmp_path)
    browser.get(f"{ui}/namespaces/default/workflows/{invalid.trial_id}")
    _open_section(browser, "User Metadata")
    _wait_for_text(browser, trial_details.summary(invalid), "RewardMissing")
    _shot(browser, "invalid", tmp_path)
