"""How fast ``rlsdk view`` shows a large run, and how much memory its server holds.

Writes a run folder of ``--samples`` samples with the run's own writer (``RunOutput``: kept and discarded
samples of realistic size, with token ids, log-probs and the trainer's log-probs; a metrics row a step;
evals every 10 steps; a word-level tokenizer the sample page decodes with), or takes ``--run DIR``. Starts
the real ``rlsdk view`` command, then loads each page afresh in Debian's headless Chromium (Playwright)
``--repeat`` times: the run (curves, evals, steps), a step, a sample, a sample search by text, a filtered
sample list sorted by reward, and two evals side by side. A page's figure is the time from the start of
its navigation to its content drawn (the page marks that moment, ``main[data-ready-at]``, in the
browser's clock), and the browser's first contentful paint. Each page's numbers are checked against the
run's files, so a page that showed nothing would fail, not look fast.

The baseline, measured in the same run: reading and parsing the whole ``rollouts.jsonl`` once, the least a
viewer without an index pays for every page. ``server_peak_rss_mb`` is the server's peak resident memory
(``VmHWM``) after every page; targets: every page under 1 s, the server under 300 MB.

Run: ``python benchmarks/view.py [--samples 10000] [--repeat 5] [--screenshots DIR]`` (last line: JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import machine

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
WORDS = 2000
"""The generated tokenizer's vocabulary."""
PROMPTS_PER_STEP, SAMPLES_PER_PROMPT = 8, 8
TARGET_MS, TARGET_MB = 1000.0, 300.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(WORDS)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def write_run(folder: Path, samples: int, seed: int = 0) -> Path:
    """A run of at least ``samples`` kept samples (8 prompts x 8 samples a step), a dropped group a step,
    evals of 40 prompts x 2 samples every 10 steps, written by ``RunOutput``."""
    from rlsdk import RolloutConfig, RolloutFnEvalOutput, RolloutFnTrainOutput, Sample, get_plugin_manager
    from rlsdk.run.output import RunOutput

    rng = random.Random(seed)
    output = RunOutput(folder)
    tokenizer = write_tokenizer(folder.parent / "tokenizer")
    steps = -(-samples // (PROMPTS_PER_STEP * SAMPLES_PER_PROMPT))  # at least ``samples``

    def sample(step: int, group: int, index: int, prompt_id: int, words: random.Random = rng) -> Sample:
        prompt = [words.randrange(WORDS) for _ in range(120)]  # an eval's prompts: the same each eval
        length = rng.randint(20, 400)
        response = [rng.randrange(WORDS) for _ in range(length)]
        lps = [-rng.expovariate(2.0) for _ in range(length)]
        s = Sample(group_index=group, index=index, prompt=f"Question {prompt_id}: " + " ".join(f"w{t}" for t in prompt),
                   tokens=prompt + response, response=" ".join(f"w{t}" for t in response), response_length=length,
                   label=str(prompt_id), reward=float(rng.random() < 0.4 + step / (2 * steps)),
                   loss_mask=[1] * length, rollout_log_probs=lps, weight_versions=[str(step)],
                   status=Sample.Status.TRUNCATED if length == 400 else Sample.Status.COMPLETED)
        s.metadata["train_log_probs"] = [lp + rng.gauss(0, 0.01) for lp in lps]
        return s

    for step in range(steps):
        groups = []
        for p in range(PROMPTS_PER_STEP + 1):
            group = step * (PROMPTS_PER_STEP + 1) + p
            groups.append([sample(step, group, group * SAMPLES_PER_PROMPT + i, group) for i in range(SAMPLES_PER_PROMPT)])
        for s in groups[-1]:
            s.metadata["drop_reason"] = "zero_std"
        kept = [s for g in groups[:-1] for s in g]
        metrics = {"rollout/reward_mean": sum(s.reward for s in kept) / len(kept), "ledger/entered": 72,
                   "ledger/kept": 64, "ledger/dropped": 8, "rollout/dynamic_filter/drop_zero_std": 8,
                   "run/elapsed_seconds": 30.0 * (step + 1)}
        metrics.update({f"train/metric_{k}": rng.random() for k in range(40)})
        output.write_step(step, RolloutFnTrainOutput(samples=groups[:-1], metrics=metrics, discarded=groups[-1:]))
        if step % 10 == 9 or step == steps - 1:
            evals = [sample(step, g, g * 2 + i, 10_000 + g, random.Random(g)) for g in range(40) for i in range(2)]
            rate = sum(s.reward for s in evals) / len(evals)
            output.write_eval(step, RolloutFnEvalOutput(data={"held_out": {"samples": evals}},
                                                        metrics={"eval/held_out/reward_mean": rate}))
    args = RolloutConfig(num_rollout=steps, hf_checkpoint=str(tokenizer), output_dir=str(folder))
    output.save_state(output.run_state(steps, {}, args, get_plugin_manager(load_entrypoints=False)))
    return folder


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def peak_rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def pages(folder: Path) -> dict[str, tuple[str, str]]:
    """Each page's address and what must show on it (a CSS selector, checked against the files)."""
    kept = folder / "rollouts.jsonl"
    with kept.open() as f:
        first = json.loads(f.readline())
    steps = rows(folder / "metrics.jsonl")
    middle = steps[len(steps) // 2]["rollout_id"]
    evals = sorted({r["rollout_id"] for r in rows(folder / "eval.jsonl")})
    word = first["response"].split()[3]
    return {
        "run": ("#/run/0", f'#steps tr[data-step="{steps[-1]["rollout_id"]}"]'),
        "step": (f"#/run/0/step/{middle}", "table.groups a.chip"),
        "sample": ("#/run/0/sample/rollouts/0", f'#tokens .tok[data-i="{len(first["tokens"]) - 1}"]'),
        "search_text": (f"#/run/0/samples?q={word}", "table.results tbody tr"),
        "search_filter": ("#/run/0/samples?min_reward=1&sort=-length", "table.results tbody tr"),
        "compare": (f"#/compare?a=0&b=0&step_a={evals[0]}&step_b={evals[-1]}", "table.compare tbody tr.link"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--run", type=Path, help="measure this run folder instead of a generated one")
    parser.add_argument("--screenshots", type=Path, help="save a screenshot of each page here")
    options = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        folder = options.run
        if folder is None:
            started = time.perf_counter()
            folder = write_run(Path(tmp) / "run", options.samples)
            log(f"wrote {folder} in {time.perf_counter() - started:.1f} s")
        kept = folder / "rollouts.jsonl"
        started = time.perf_counter()
        everything = rows(kept)  # the baseline: the whole file read and parsed once
        baseline_s = time.perf_counter() - started
        exe = Path(sys.executable).with_name("rlsdk")
        started = time.perf_counter()
        server = subprocess.Popen([str(exe), "view", str(folder), "--port", "0"], stdout=subprocess.PIPE, text=True)
        try:
            server.stdout.readline()
            url = server.stdout.readline().split()[1]
            startup_s = time.perf_counter() - started
            base = url.split("/?")[0]
            results: dict[str, Any] = {}
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                page.goto(url)  # the token becomes this context's cookie
                page.wait_for_selector("main[data-ready]")
                for name, (address, shown) in pages(folder).items():
                    ready, paints = [], []
                    for _ in range(options.repeat):
                        page.goto("about:blank")
                        page.goto(f"{base}/{address}")
                        page.wait_for_selector("main[data-ready-at]", timeout=60_000)
                        ready.append(float(page.locator("main").get_attribute("data-ready-at")))
                        paint = page.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime")
                        paints.append(paint)
                        assert page.locator(shown).count() > 0, f"{name}: nothing matches {shown}"
                    results[name] = {"ready_ms_median": round(statistics.median(ready), 1), "ready_ms_max": max(ready),
                                     "first_contentful_paint_ms_median": statistics.median(p for p in paints if p)}
                    log(f"{name}: {results[name]}")
                    if options.screenshots:
                        options.screenshots.mkdir(parents=True, exist_ok=True)
                        height = min(page.evaluate("document.body.scrollHeight"), 1800)  # a long list: its top
                        page.screenshot(path=str(options.screenshots / f"{name}.png"), full_page=True,
                                        clip={"x": 0, "y": 0, "width": 1280, "height": height})
                total = page.evaluate("fetch('/api/runs/0/samples?limit=1').then(r => r.json()).then(b => b.total)")
                assert total == len(everything), (total, len(everything))  # every sample is listed
                browser.close()
            rss, peak = peak_rss_mb(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
        slowest = max(r["ready_ms_max"] for r in results.values())
        report = {
            "benchmark": "view",
            "machine": {**machine(), "load_average_1min": round(os.getloadavg()[0], 2)},
            "inputs": {"samples": len(everything), "repeat": options.repeat,
                       "rollouts_mb": round(kept.stat().st_size / 2**20, 1), "generated": options.run is None},
            "startup_s": round(startup_s, 3),
            "pages": results,
            "slowest_page_ms": slowest,
            "server_rss_mb": round(rss, 1),
            "server_peak_rss_mb": round(peak, 1),
            "baseline": {"read_whole_rollouts_ms": round(baseline_s * 1000, 1)},
            "ratio": round(baseline_s * 1000 / slowest, 3),
            "meets_target": slowest < TARGET_MS and peak < TARGET_MB,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
