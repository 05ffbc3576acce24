"""``rlsdk view`` as a person uses it: the real command serves runs made by the tests, and Debian's headless
Chromium, driven by Playwright, goes from the curves to a step to a sample, searches, compares two evals,
reads an agent's conversation and trajectory tree and watches a running run grow; every number checked is
read from the run's files. Each page's screenshot goes to the test's folder (``RLSDK_VIEW_SCREENSHOTS=DIR``
puts them in DIR).

CI installs Chromium (``.ci/run``); elsewhere, without it, these tests skip saying so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlsdk.run.folder import folder_lock

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium under Playwright (never a browser Playwright downloads)."""
    missing = [] if os.path.exists(CHROMIUM) else [f"{CHROMIUM} (apt-get install chromium)"]
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright package (pip install -e '.[test]')")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the browser tests: missing {', '.join(missing)}")
        pytest.skip(f"needs {', '.join(missing)}")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@contextmanager
def viewer(*folders: Path) -> Iterator[str]:
    """``rlsdk view FOLDERS --port 0`` in a fresh process; the URL it prints."""
    exe = Path(sys.executable).with_name("rlsdk")
    process = subprocess.Popen([str(exe), "view", *map(str, folders), "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        process.stdout.readline()
        line = process.stdout.readline()
        assert line.startswith("open http://"), line + process.stderr.read()
        yield line.split()[1]
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture
def page(browser, tmp_path):
    """A new page; any script error on it fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield opened
    context.close()
    assert not errors, errors


def shot(page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("RLSDK_VIEW_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    assert (folder / f"{name}.png").stat().st_size > 10_000


def wait_page(page, name: str, hash_part: str = "") -> None:
    """Until the page named ``name`` has rendered for an address that holds ``hash_part``: the address the
    page was rendered for, not the current one (after a form's submit the address changes at once, and the
    page of the old address still stands, ready, until the browser reports the change)."""
    page.wait_for_function(
        "([name, part]) => (document.querySelector('main').dataset.route || '').includes(part)"
        " && document.querySelector('main').dataset.ready === '1'"
        " && document.querySelector('main').dataset.page === name",
        arg=[name, hash_part],
        timeout=20_000,
    )


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def value(locator) -> float:
    return float(locator.get_attribute("data-value"))


def test_from_the_curves_to_a_step_to_a_sample(trained_run, page, tmp_path):
    metrics, kept = rows(trained_run / "metrics.jsonl"), rows(trained_run / "rollouts.jsonl")
    discarded = rows(trained_run / "discarded.jsonl")
    with viewer(trained_run) as url:
        page.goto(url)  # one run: its page
        wait_page(page, "run", "#/run/0")
        assert "token=" not in page.url  # the token became a cookie
        rewards = page.locator('.chart[data-metric="reward"] circle[data-series="rollout/reward_mean"]')
        assert [value(rewards.nth(i)) for i in range(rewards.count())] == [m["rollout/reward_mean"] for m in metrics]
        shot(page, "run", tmp_path)

        rewards.nth(1).click(force=True)  # the curve's point of step 1 (the other series may lie on it)
        wait_page(page, "step", "#/run/0/step/1")
        step = metrics[1]
        for card in page.locator("#ledger .card").all():
            label = card.locator(".label").inner_text()
            assert value(card.locator(".number")) == step[f"ledger/{label}"]
        chips = page.locator("table.groups a.chip")
        mine = [r for r in kept if r["rollout_id"] == 1]
        assert [float(c.get_attribute("data-reward")) for c in chips.all()] == [r["reward"] for r in mine]
        dropped = [r for r in discarded if r["rollout_id"] == 1]
        assert page.get_by_text(f"odd_prompt: {len(dropped)} samples").count() == 1
        shot(page, "step", tmp_path)

        n = int(chips.nth(2).get_attribute("data-n"))
        chips.nth(2).click()
        wait_page(page, "sample", f"#/run/0/sample/rollouts/{n}")
        row = kept[n]
        assert value(page.locator("#reward .number")) == row["reward"]
        assert page.locator("#response").inner_text() == row["response"]
        assert page.locator("#tokens .tok").count() == len(row["tokens"])
        gaps = [abs(a - b) for a, b in zip(row["rollout_log_probs"], row["metadata"]["train_log_probs"], strict=True)]
        shown = page.locator("#logprob-stats .card", has_text="mean |gap|").locator(".number")
        assert value(shown) == pytest.approx(sum(gaps) / len(gaps))
        page.locator('#tokens .tok[data-j="0"]').click()
        assert value(page.locator("#token-detail .number").first) == row["rollout_log_probs"][0]
        shot(page, "sample", tmp_path)


def test_search_and_two_evals_side_by_side(trained_run, page, tmp_path):
    kept, evals = rows(trained_run / "rollouts.jsonl"), rows(trained_run / "eval_samples.jsonl")
    with viewer(trained_run) as url:
        page.goto(url)
        wait_page(page, "run")
        page.get_by_role("link", name="Search samples").click()
        wait_page(page, "samples")
        page.fill('input[name="min_reward"]', "1")
        page.select_option('select[name="sort"]', "-length")
        page.click('button[type="submit"]')
        wait_page(page, "samples", "min_reward=1")
        best = [r for r in kept if r["reward"] >= 1]
        assert page.locator("#total").inner_text() == f"{len(best)} samples"
        lengths = [int(td.inner_text()) for td in page.locator("table.results tbody tr td:nth-child(5)").all()]
        assert lengths == sorted((r["response_length"] for r in best), reverse=True)
        shot(page, "samples", tmp_path)

        page.goto(url.split("/?")[0] + "/#/compare?a=0&b=0&step_a=-1&step_b=2")
        wait_page(page, "compare")

        def mean(step: int) -> float:
            rewards = [r["reward"] for r in evals if r["rollout_id"] == step]
            return sum(rewards) / len(rewards)

        summary = page.locator("#compare-summary")
        assert value(summary.locator(".card", has_text="mean A").locator(".number")) == pytest.approx(mean(-1))
        assert value(summary.locator(".card", has_text="mean B").locator(".number")) == pytest.approx(mean(2))
        page.locator("table.compare tbody tr.link").first.click()
        page.wait_for_selector(".sidebyside .message")
        first = page.locator("table.compare tbody tr.link").first.get_attribute("data-key")
        assert first and page.locator(".sidebyside .message").count() == 4  # two samples a prompt, each side
        shot(page, "compare", tmp_path)


def test_an_agent_sample_shows_its_conversation_tools_and_trajectory_tree(agent_run, page, tmp_path):
    row = rows(agent_run / "rollouts.jsonl")[0]
    tree = row["metadata"]["agent"]["tree"]
    with viewer(agent_run) as url:
        page.goto(url.split("/?")[0] + "/?" + url.split("/?")[1] + "#/run/0/sample/rollouts/0")
        wait_page(page, "sample", "#/run/0/sample/rollouts/0")
        conversation = page.locator("#agent-messages")
        assert conversation.locator(".message.tool .text").inner_text() == "6"
        assert "calculator" in conversation.locator(".toolcall").inner_text()
        assert page.locator("#tree .node").count() == len(tree["nodes"])
        assert page.locator("#tree .node.trained").count() == len(tree["trained"])
        text = page.locator("#tree").inner_text()
        assert tree["branches"] == 2 and " times 3?" in text and "*3?" in text  # the two questions' branches
        assert page.get_by_text("observation (not trained)").count() >= 1  # the tool's tokens, loss mask 0
        shot(page, "agent", tmp_path)


def test_a_running_run_grows_on_the_open_page(trained_run, page, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder)
    with viewer(folder) as url, folder_lock(folder):  # held as a run holds its folder
        page.goto(url)
        wait_page(page, "run")
        assert page.locator("#live").inner_text() == "● live"
        with (folder / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"rollout_id": 3, "rollout/reward_mean": 0.125}) + "\n")
        page.wait_for_selector('#steps tr[data-step="3"]', timeout=20_000)
        point = page.locator('.chart[data-metric="reward"] circle[data-step="3"]')
        assert value(point) == 0.125


def test_a_sample_that_writes_markup_is_shown_as_text(page, tmp_path):
    """A model can write anything: HTML and script in a prompt, response or label stay text on every page."""
    from rlsdk import RolloutFnTrainOutput, Sample
    from rlsdk.run.output import RunOutput

    markup = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script><b>bold</b>'
    output = RunOutput(tmp_path / "run")
    sample = Sample(group_index=0, index=0, prompt=markup, tokens=[1, 2, 3], response=markup, response_length=1,
                    label=markup, reward=1.0, status=Sample.Status.COMPLETED, rollout_log_probs=[-0.1])
    output.write_step(0, RolloutFnTrainOutput(samples=[[sample]], metrics={"rollout/reward_mean": 1.0}))
    with viewer(output.folder) as url:
        base = url.split("/?")[0]
        page.goto(url)
        for address, name in (("#/run/0/step/0", "step"), ("#/run/0/samples?q=onerror", "samples"),
                              ("#/run/0/sample/rollouts/0", "sample")):
            page.goto(f"{base}/{address}")
            wait_page(page, name, address.split("?")[0])
            assert page.locator("main img, main script, main b").count() == 0
            assert page.title() == "rlsdk view"
        assert page.locator("#response").inner_text() == markup
