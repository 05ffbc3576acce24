"""Deterministic mode (``--deterministic``): two runs of the tiny Llama with the same seed write the same
``metrics.jsonl`` and ``eval.jsonl`` byte for byte, and the check names each part of a run that is not
deterministic, and why."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk.engine_api import SGLangClient
from rlsdk.engines.launch.sglang import plan_launch
from rlsdk.run.determinism import nondeterministic_parts
from rlsdk.run.job import run_job
from rlsdk.runtime import Runtime
from rlsdk.testing import FakeEngine


def deterministic_run(tiny_llama: Path, run_files: tuple[Path, str], out: Path) -> None:
    data, reward = run_files
    held = data.with_name("held.jsonl")
    held.write_text("".join(data.read_text().splitlines(keepends=True)[:4]))
    run_job(
        RolloutConfig(
            model=str(tiny_llama), prompt_data=str(data), rm_type=reward, train=True, lr=3e-2,
            rollout_batch_size=2, n_samples_per_prompt=3, rollout_max_response_len=2, num_rollout=20,
            rollout_shuffle=True, eval_interval=10, eval_prompt_data=["held", str(held)],
            engine_threads=1, train_threads=1, output_dir=str(out), sglang_enable_deterministic_inference=True,
        )
    )


@pytest.mark.plugins("rlsdk_embedded")
@pytest.mark.slow
def test_two_deterministic_runs_write_identical_metrics(tiny_llama, run_files, tmp_path):
    """20 training steps with evals, twice: the same bytes in metrics.jsonl, eval.jsonl and rollouts' tokens
    and log-probs; the wall-clock figures (which differ) are in timings.jsonl."""
    deterministic_run(tiny_llama, run_files, tmp_path / "a")
    deterministic_run(tiny_llama, run_files, tmp_path / "b")
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert (a / "eval.jsonl").read_bytes() == (b / "eval.jsonl").read_bytes()
    rows = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and not any(key.endswith(("seconds", "_per_s")) for row in rows for key in row)
    assert len({row["rollout/reward_mean"] for row in rows}) > 1  # the steps sampled different things
    assert all("train/rollout_logprob_diff" in row and "train/grad_norm" in row for row in rows)
    timings = [[json.loads(line) for line in (run / "timings.jsonl").read_text().splitlines()] for run in (a, b)]
    assert [t["rollout/seconds"] for t in timings[0] if "rollout/seconds" in t] != [
        t["rollout/seconds"] for t in timings[1] if "rollout/seconds" in t
    ]  # wall clocks differ: moving them out is what makes the files equal
    samples = [
        [(r["tokens"], r["rollout_log_probs"]) for r in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines())]
        for run in (a, b)
    ]
    assert samples[0] == samples[1]
    assert json.loads((a / "determinism.json").read_text()) == {
        "deterministic": True,
        "rollout_seed": 42,
        "not_deterministic": [],
    }
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "determinism.py"
    done = subprocess.run([sys.executable, str(script), "--compare", str(a), str(b)], capture_output=True, text=True,
                          timeout=60, check=True)
    compared = json.loads(done.stdout.splitlines()[-1])  # the GPU phase's comparison, on these two runs
    assert compared["identical_reward_curves"] and compared["steps"] == [20, 20]
    assert compared["first_differences"] == {"metrics.jsonl": None, "eval.jsonl": None}


async def server_info_app(info: dict | None) -> web.AppRunner:
    """A server answering ``/server_info`` as SGLang does (its arguments), or 404 like a server that has none."""

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response(info) if info is not None else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize(
    ("info", "says"),
    [
        ({"tp_size": 1, "enable_deterministic_inference": False}, "runs without --enable-deterministic-inference"),
        ({"tp_size": 1}, "runs without --enable-deterministic-inference (its /server_info says None)"),
        (None, "does not report its arguments"),
        ({"tp_size": 1, "enable_deterministic_inference": True}, None),
    ],
)
def test_a_url_sglang_engine_without_its_deterministic_flag_is_named(info, says):
    """Real HTTP on loopback: the SGLang client reads each worker's /server_info."""

    async def check() -> str | None:
        runner = await server_info_app(info)
        port = runner.addresses[0][1]
        client = SGLangClient(f"http://127.0.0.1:{port}", retries=0)
        try:
            return await client.nondeterminism()
        finally:
            await client.close()
            await runner.cleanup()

    found = asyncio.run(check())
    if says is None:
        assert found is None
    else:
        assert says in found and "127.0.0.1" in found


def test_the_check_names_each_part_that_is_not_deterministic():
    engine = FakeEngine(["x"])
    runtime = Runtime(get_plugin_manager(plugins=[]), engine)
    try:
        args = RolloutConfig(
            train=True, train_async=True, partial_rollout=True, over_sampling_batch_size=8, rollout_batch_size=4,
            sglang_enable_deterministic_inference=True, trainer="mine",
        )
        parts = {part.part: part.why for part in nondeterministic_parts(args, runtime)}
        assert "does not say whether its outputs are reproducible" in parts["engine 'embedded'"]
        assert set(parts) == {
            "engine 'embedded'",
            "--async / --max-policy-version-lag",
            "--partial-rollout",
            "--over-sampling-batch-size",
            "trainer 'mine'",
        }
        plain = RolloutConfig(sglang_enable_deterministic_inference=True)
        assert [p.part for p in nondeterministic_parts(plain, runtime)] == ["engine 'embedded'"]
    finally:
        runtime.loop.close()


@pytest.mark.plugins("rlsdk_embedded")
def test_the_embedded_engine_runs_one_request_at_a_time_in_deterministic_mode():
    from rlsdk_embedded.plugin import embedded

    engine = embedded(RolloutConfig(sglang_enable_deterministic_inference=True))
    assert engine.max_batch_size == 1 and asyncio.run(engine.nondeterminism()) is None
    batched = embedded(RolloutConfig())
    assert "decodes up to 64 requests in one batch" in asyncio.run(batched.nondeterminism())


def test_launched_sglang_servers_get_the_deterministic_flag():
    plan = plan_launch(RolloutConfig(sglang_enable_deterministic_inference=True), "/models/m")
    assert "--enable-deterministic-inference" in plan.engines[0].command
    assert "--enable-deterministic-inference" not in plan_launch(RolloutConfig(), "/models/m").engines[0].command


def test_machine_figures_leave_metrics_jsonl_in_deterministic_mode():
    """Wall clocks and GPU memory peaks (the allocator's: two H200 runs differed there by 0.04 GB) are
    timings; what the seeds decide is not."""
    from rlsdk.outputs import is_timing

    for key in ("train/seconds", "rollout/tokens_per_s", "train/peak_memory_gb", "memory/peak_gpu_gb_train"):
        assert is_timing(key), key
    for key in ("train/loss", "train/grad_norm", "rollout/reward_mean", "ledger/kept"):
        assert not is_timing(key), key


def test_deterministic_mode_trains_attention_on_torchs_math_kernels():
    """The memory-efficient attention kernel's backward pass is not deterministic (torch only warns): on one
    H200 it made two runs' first gradients differ. In a process of its own: the switches are global."""
    code = (
        "import torch; from rlsdk.training.seeds import seed_everything; seed_everything(3); "
        "b = torch.backends.cuda; print(b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), "
        "b.cudnn_sdp_enabled(), b.math_sdp_enabled(), torch.are_deterministic_algorithms_enabled())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False", "False", "False", "True", "True"]


def torch_switches() -> tuple:
    import torch

    cuda = torch.backends.cuda
    return (
        torch.are_deterministic_algorithms_enabled(),
        cuda.mem_efficient_sdp_enabled(),
        cuda.flash_sdp_enabled(),
        torch.backends.cudnn.deterministic,
    )


@pytest.mark.plugins("rlsdk_embedded")
def test_a_kernel_without_a_deterministic_implementation_is_named_in_the_check(tiny_llama, run_files, tmp_path):
    """A reward whose torch op has no deterministic implementation: torch only warns (on one H200 the trainer's
    memory-efficient attention did, and two runs differed); the run's check names the kernel. The op is torch's
    own alert (``alert_not_deterministic``, which its kernels call): no CPU kernel lacks a deterministic one."""
    from rlsdk.run.determinism import NondeterminismWarning

    data, _ = run_files
    reward = tmp_path / "alerting.py"
    reward.write_text(
        "import torch._prims_common as prims\n\n\n"
        "def alerting(args, sample, **kwargs):\n"
        "    prims.alert_not_deterministic('scatter_kernel_under_test')\n"
        "    return 1.0\n"
    )
    out = tmp_path / "run"
    before = torch_switches()
    with pytest.warns(NondeterminismWarning, match="kernel 'scatter_kernel_under_test'"):
        run_job(
            RolloutConfig(
                model=str(tiny_llama), prompt_data=str(data), rm_type=f"{reward}:alerting", rollout_batch_size=2,
                n_samples_per_prompt=2, rollout_max_response_len=2, num_rollout=1, engine_threads=1,
                output_dir=str(out), sglang_enable_deterministic_inference=True,
            )
        )
    assert torch_switches() == before  # the mode lasted for its run: the next one in this process is as it was
    report = json.loads((out / "determinism.json").read_text())
    assert report["deterministic"] is False
    assert report["not_deterministic"] == [
        {
            "part": "kernel 'scatter_kernel_under_test'",
            "why": "torch ran it without a deterministic implementation (it only warns)",
        }
    ]
