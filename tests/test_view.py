"""``rlsdk view`` without a browser: the byte-offset index as a file grows, is cut back or replaced; what
each page's API answers, checked against the run's files; the server's rules (token, Host, Origin,
parameters, only the run folders' files); the command line. The pages themselves: test_view_browser.py."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from rlsdk import RolloutConfig, RolloutFnEvalOutput, RolloutFnTrainOutput, Sample, get_plugin_manager
from rlsdk.run.folder import folder_lock
from rlsdk.run.output import RunOutput
from rlsdk.view.compare import compare
from rlsdk.view.index import JsonlIndex
from rlsdk.view.runs import RunFolder, ViewError, find_runs
from rlsdk.view.samples import Filters
from rlsdk.view.server import cookie_name, start_view

TOKEN = "a-test-token-of-enough-length"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sample(index: int, reward, response: str, status=Sample.Status.COMPLETED, prompt="What is 2 + 3?") -> Sample:
    return Sample(group_index=index // 2, index=index, prompt=prompt, tokens=[1, 2, 3] + [4] * (index + 1),
                  response=response, response_length=index + 1, label="5", reward=reward, status=status,
                  rollout_log_probs=[-0.5] * (index + 1))


def write_run(folder: Path, steps: int = 2, dropped: bool = True) -> RunOutput:
    """A run folder written by the run's own writer: each step two groups of two samples kept (one with
    non-ASCII text), a group dropped by a filter, a metrics row, and the saved state."""
    output = RunOutput(folder)
    for step in range(steps):
        kept = [[sample(0, 1.0, "The answer is 5."), sample(1, 0.0, "Die Größe ist 6.")],
                [sample(2, 0.5, "five", Sample.Status.TRUNCATED), sample(3, None, "no idea")]]
        discarded = []
        if dropped:
            discarded = [[sample(4, 1.0, "5"), sample(5, 1.0, "5")]]
            for s in discarded[0]:
                s.metadata["drop_reason"] = "zero_std"
        metrics = {"rollout/reward_mean": 0.5 + step / 10, "ledger/kept": 4, "ledger/dropped": 2,
                   "rollout/dynamic_filter/drop_zero_std": 2, "train/grad_norm": math.nan, "run/elapsed_seconds": 3.0 * step}
        output.write_step(step, RolloutFnTrainOutput(samples=kept, metrics=metrics, discarded=discarded))
    args = RolloutConfig(num_rollout=steps, output_dir=str(folder))
    output.save_state(output.run_state(steps, {}, args, get_plugin_manager(load_entrypoints=False)))
    return output


# ------------------------------------------------------------------ the index


def test_the_index_follows_a_growing_file_and_starts_over_when_it_is_cut_or_replaced(tmp_path):
    path = tmp_path / "rows.jsonl"
    index = JsonlIndex(path, lambda row, line: {"step": row["rollout_id"]}, ints=("step",))
    assert not index.refresh() and len(index) == 0  # no file yet
    path.write_text('{"rollout_id": 0}\n{"rollout_id": 1}\n{"rollout_id"')
    assert index.refresh() and len(index) == 2 and index.partial == len('{"rollout_id"')  # a line being written
    with path.open("a") as f:
        f.write(': 2}\nnot json\n')
    index.refresh()
    assert [index.int_value("step", n) for n in range(len(index))] == [0, 1, 2, None]
    assert index.bad_lines == [3] and index.read(3) is None and index.read(2) == {"rollout_id": 2}
    assert not index.refresh()  # nothing new: nothing read
    # --resume cuts a crash's lines off, then the run appends other ones past the old end
    with path.open("r+") as f:
        f.truncate(len('{"rollout_id": 0}\n'))
    with path.open("a") as f:
        f.write('{"rollout_id": 7}\n{"rollout_id": 8}\n{"rollout_id": 9}\n')
    index.refresh()
    assert [index.int_value("step", n) for n in range(len(index))] == [0, 7, 8, 9]
    # --overwrite replaces the file
    path.unlink()
    path.write_text('{"rollout_id": 5}\n')
    index.refresh()
    assert [index.int_value("step", n) for n in range(len(index))] == [5]


def test_lists_filter_sort_and_search_the_text_without_reading_the_whole_file(tmp_path):
    write_run(tmp_path / "run")
    run = RunFolder(tmp_path / "run", 0)
    run.refresh()
    kept = run.samples["rollouts"]
    assert len(kept.index) == 8 and sorted(kept.steps) == [0, 1]
    assert kept.lines(Filters(step=1)) == [4, 5, 6, 7]
    assert kept.lines(Filters(min_reward=0.5)) == [0, 2, 4, 6]  # no reward (None) passes no bound
    assert kept.lines(Filters(max_reward=0.0, step=0)) == [1]
    assert kept.lines(Filters(min_length=2, max_length=3)) == [1, 2, 5, 6]
    assert kept.lines(Filters(status="truncated")) == [2, 6] and kept.lines(Filters(status="nope")) == []
    assert kept.lines(Filters(text="GRÖßE")) == kept.lines(Filters(text="größe")) == [1, 5]  # any case
    assert kept.lines(Filters(text="response_length")) == []  # a key of the line is not its text
    assert kept.lines(Filters(text="truncated")) == []  # nor is another field's value
    assert kept.lines(Filters(text="what is 2")) == list(range(8))  # in the prompt
    assert kept.sort(kept.lines(Filters(step=0)), "-reward") == [0, 2, 1, 3]  # no reward last
    with (tmp_path / "run" / "rollouts.jsonl").open("a") as f:  # written by another writer: compact, UTF-8
        f.write(json.dumps({"rollout_id": 2, "response": "GRÖßE", "metadata": {"x": "größe"}}, separators=(",", ":"),
                           ensure_ascii=False) + "\n")
        f.write(json.dumps({"rollout_id": 2, "response": "-", "metadata": {"x": "größe"}}, separators=(",", ":"),
                           ensure_ascii=False) + "\n")
    run.refresh()
    assert kept.lines(Filters(text="größe")) == [1, 5, 8]  # that line read and checked
    page = run.search("rollouts", Filters(step=None), "length", offset=6, limit=5)
    assert page["total"] == 10 and [r["n"] for r in page["rows"]] == [3, 7, 8, 9]
    assert page["rows"][0]["response"] == "no idea" and page["facets"]["status"] == ["completed", "truncated"]
    dropped = run.search("discarded", Filters(reason="zero_std"))
    assert dropped["total"] == 4 and dropped["facets"]["reason"] == ["zero_std"]


def test_step_and_sample_data_match_the_run_files(trained_run):
    run = RunFolder(trained_run, 0)
    run.refresh()
    kept, discarded = rows(trained_run / "rollouts.jsonl"), rows(trained_run / "discarded.jsonl")
    metrics = rows(trained_run / "metrics.jsonl")
    for row in metrics:
        step = run.step(row["rollout_id"])
        assert step["metrics"] == row
        shown = {(g["group"], s["index"], s["reward"]) for g in step["groups"] for s in g["samples"]}
        assert shown == {(r["group_index"], r["index"], r["reward"]) for r in kept if r["rollout_id"] == row["rollout_id"]}
        dropped = sum(len(g["samples"]) for part in step["discarded"] for g in part["groups"])
        assert dropped == sum(r["rollout_id"] == row["rollout_id"] for r in discarded)
    assert discarded, "the filter dropped no group: the run does not exercise the discarded list"
    first = run.sample("rollouts", 0)
    assert first["row"] == kept[0]
    words = ["<eos>", "<pad>", *[f"w{i}" for i in range(30)]]  # the tiny Llama's vocabulary
    assert first["pieces"] == [words[i] for i in kept[0]["tokens"]]
    assert first["tokenizer"]["source"].startswith(str(json.loads((trained_run / "state.json").read_text())["settings"]["hf_checkpoint"]))
    assert len(first["train_log_probs"]) == kept[0]["response_length"]  # the trainer's, recorded by it
    assert first["train_log_probs"] == kept[0]["metadata"]["train_log_probs"]
    assert run.step(metrics[-1]["rollout_id"])["eval"]["rollout_id"] == metrics[-1]["rollout_id"]
    with pytest.raises(ViewError, match=r"step 99 is not in this run \(steps: 0\.\.2\)"):
        run.step(99)
    with pytest.raises(ViewError, match="no line 10000"):
        run.sample("rollouts", 10000)


def test_two_evals_are_matched_prompt_by_prompt(tmp_path):
    outputs = []
    for name, rewards in (("a", [1.0, 0.0, 0.0]), ("b", [1.0, 1.0, 0.0])):
        output = RunOutput(tmp_path / name)
        samples = [sample(i, r, "x", prompt=f"question {i}") for i, r in enumerate(rewards)]
        extra = [sample(9, 1.0, "x", prompt="only here")] if name == "b" else []
        output.write_eval(3, RolloutFnEvalOutput(data={"math": {"samples": samples + extra}}))
        outputs.append(RunFolder(output.folder, len(outputs)))
    for run in outputs:
        run.refresh()
    both = compare(outputs[0], outputs[1])
    assert (both["total"], both["better"], both["worse"], both["same"], both["only_b"]) == (3, 1, 0, 2, 1)
    assert both["rows"][-1]["delta"] == 1.0 and both["rows"][-1]["prompt"] == "question 1"
    assert both["mean_a"] == pytest.approx(1 / 3) and both["mean_b"] == pytest.approx(2 / 3)
    with pytest.raises(ViewError, match="no eval after step 5"):
        compare(outputs[0], outputs[1], step_a=5)


def test_a_folder_of_runs_stands_for_them_and_anything_else_is_refused(tmp_path):
    write_run(tmp_path / "runs" / "a")
    write_run(tmp_path / "runs" / "b")
    assert find_runs([tmp_path / "runs"]) == [(tmp_path / "runs" / n).resolve() for n in "ab"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ViewError, match="not a run folder"):
        find_runs([tmp_path / "empty"])
    with pytest.raises(ViewError, match="no such folder"):
        find_runs([tmp_path / "missing"])


# ------------------------------------------------------------------ the server


def serve(folders, check, **options):
    """Run ``check(http, server)`` against a viewer of ``folders`` on loopback."""

    async def go():
        runs = [RunFolder(Path(f), i) for i, f in enumerate(folders)]
        server = await start_view(runs, token=TOKEN, **options)
        try:
            async with aiohttp.ClientSession(base_url=server.base, cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                return await check(http, server)
        finally:
            await server.close()

    return asyncio.run(go())


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_the_page_needs_the_token_of_its_url_which_becomes_a_cookie_of_its_port(tmp_path):
    write_run(tmp_path / "run")

    async def check(http, server):
        assert (await http.get("/")).status == 401
        assert (await http.get("/api/runs")).status == 401
        assert (await http.get("/?token=wrong-token-of-some-length")).status == 401
        opened = await http.get(f"/?token={TOKEN}", allow_redirects=False)
        assert opened.status == 302 and opened.headers["Location"] == "/"  # the token leaves the address bar
        cookie = opened.headers["Set-Cookie"]
        assert cookie.startswith(f"{cookie_name(server.port)}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        page = await http.get("/")  # the session keeps the cookie
        assert page.status == 200 and "script-src 'self'" in page.headers["Content-Security-Policy"]
        assert '<script src="/static/app.js"' in await page.text()
        runs = await (await http.get("/api/runs")).json()
        assert runs["runs"][0]["name"] == "run" and runs["runs"][0]["samples"] == {"rollouts": 8, "discarded": 4, "eval": 0}

    serve([tmp_path / "run"], check)


def test_hostile_requests_are_refused_before_any_file_is_read(tmp_path):
    write_run(tmp_path / "run")

    async def check(http, server):
        async def status(path, method="GET", **headers):
            async with http.request(method, path, headers={**AUTH, **headers}) as response:
                return response.status, (await response.text())[:300]

        assert (await status("/api/runs", Host="evil.example"))[0] == 421  # DNS rebinding
        assert (await status("/api/runs", Origin="http://evil.example"))[0] == 403
        assert (await status("/api/runs", "POST", **{"Content-Type": "application/json"}))[0] == 405
        assert (await status("/api/runs", "POST", **{"Content-Type": "text/plain"}))[0] == 415
        assert (await status("/api/runs/0/samples?limit=1000"))[0] == 400
        assert (await status("/api/runs/0/samples?file=../../etc/passwd"))[0] == 400
        assert (await status("/api/runs/0/samples?min_reward=nan"))[0] == 400
        assert (await status("/api/runs/0/samples?q=" + "x" * 201))[0] == 400
        assert (await status("/api/runs/0/samples?color=red")) == (400, '{"error":"unknown parameters: color"}')
        assert (await status("/api/runs/1"))[0] == 400  # one run: 0 only
        assert (await status("/api/runs/0/steps/12345678901"))[0] == 404  # the route's pattern
        assert (await status("/api/runs/0/samples/state/0"))[0] == 400
        assert (await status("/api/runs/0/samples/rollouts/99"))[0] == 404
        assert (await status("/static/../runs.py"))[0] == 404
        assert (await status("/static/%2e%2e%2fserver.py"))[0] == 404
        assert (await status("/static/index.html"))[0] == 404
        ok = await status("/static/app.js")
        assert ok[0] == 200 and "use strict" in ok[1]

    serve([tmp_path / "run"], check)


def test_the_api_reads_what_a_running_run_appends_and_says_what_is_unfinished(tmp_path):
    output = write_run(tmp_path / "run", steps=1)

    async def check(http, server):
        async def get(path, **params):
            async with http.get(path, headers=AUTH, params=params) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        first = await get("/api/runs/0/metrics")
        assert first["next"] == 1 and "train/grad_norm" not in first["rows"][0]  # NaN is not a point
        step = await get("/api/runs/0/steps/0")
        assert step["metrics"]["train/grad_norm"] is None  # JSON has no NaN
        with folder_lock(output.folder):  # as a run holds its folder
            output.append("metrics.jsonl", [{"rollout_id": 1, "rollout/reward_mean": 0.9}])
            with (output.folder / "rollouts.jsonl").open("a") as f:
                f.write('{"rollout_id": 1, "index"')
            summary = await get("/api/runs/0")
            assert summary["status"] == "running"
            new = await get("/api/runs/0/metrics", since="1")
            assert new == {"rows": [{"rollout_id": 1, "rollout/reward_mean": 0.9}], "next": 2}
            notes = " ".join(summary["notes"])
            assert "rollouts.jsonl ends with 25 bytes of a line being written" in notes
            assert "metrics.jsonl: 1 lines written after the saved state" in notes
        assert (await get("/api/runs/0"))["status"] == "finished"

    serve([tmp_path / "run"], check)


def test_compare_and_search_answer_over_http(trained_run, tmp_path):
    other = tmp_path / "copy"
    shutil.copytree(trained_run, other)

    async def check(http, server):
        async def get(path, **params):
            async with http.get(path, headers=AUTH, params=params) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        both = await get("/api/compare", a="0", b="1", step_a="-1", step_b="-1")
        assert both["same"] == both["total"] == 8 and both["datasets"] == ["words"]
        found = await get("/api/runs/0/samples", file="eval", dataset="words", step="-1")
        assert found["total"] == 16
        text = rows(trained_run / "eval_samples.jsonl")[0]["response"]
        assert (await get("/api/runs/0/samples", file="eval", q=text.upper()))["total"] >= 1

    serve([trained_run, other], check)


# ------------------------------------------------------------------ the command line


def rlsdk(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("rlsdk")
    return subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=timeout)


def test_rlsdk_view_refuses_a_folder_that_holds_no_run(tmp_path):
    done = rlsdk("view", str(tmp_path))
    assert done.returncode == 2 and "is not a run folder" in done.stderr


def test_rlsdk_view_prints_the_url_to_open_and_stops_on_sigterm(tmp_path):
    write_run(tmp_path / "run")
    exe = Path(sys.executable).with_name("rlsdk")
    env = {**os.environ, "RLSDK_VIEW_TOKEN": TOKEN}
    process = subprocess.Popen([str(exe), "view", str(tmp_path / "run"), "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [process.stdout.readline(), process.stdout.readline()]
        assert lines[0].startswith("rlsdk view: 1 run (run)")
        url = lines[1].split()[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={TOKEN}")
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0
