"""vLLM 0.26.0's answers, as ``tests/fixtures/vllm-0.26.0-*.json`` restate them from its source (no GPU was left
to capture them; ``benchmarks/gpu/vllm_checks.py`` captures the real ones into the same layout): the client
reads each of them into rlsdk's protocol, sends what vLLM's request models take, and the stand-in
(:mod:`rlsdk_engine_vllm.stand_in`) answers in the same shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from rlsdk.engine_api import EngineError, EngineRequestError, ServedChecksums

from rlsdk_engine_vllm.client import VLLMClient
from rlsdk_engine_vllm.stand_in import ServedVLLM
from rlsdk_engine_vllm.translate import completion_request

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures"
COMPLETIONS = json.loads((FIXTURES / "vllm-0.26.0-completions.json").read_text())
CONTROL = json.loads((FIXTURES / "vllm-0.26.0-control.json").read_text())
LORA = json.loads((FIXTURES / "vllm-0.26.0-lora.json").read_text())
PROMPT = COMPLETIONS["single"][1]["choices"][0]["prompt_token_ids"]
"""The prompt every completion case was asked for. Expected values below come from the fixtures, so captured
answers (``vllm_checks.py``) replace the restated ones without a change here."""


def choice(case: str) -> dict[str, Any]:
    """The one choice of completion case ``case``."""
    return COMPLETIONS[case][1]["choices"][0]


def answer(status_body: list[Any]) -> web.Response:
    status, body = status_body
    if isinstance(body, str):
        return web.Response(text=body, status=status)
    return web.json_response(body, status=status)


def replay(
    scenario: Callable[[VLLMClient, list[dict[str, Any]]], Awaitable[Any]],
    control: dict[str, str] | None = None,
) -> Any:
    """A server answering each route with a fixture's body (a completion: the case its ``request_id`` names;
    ``control`` maps a route to another case than its own), the client against it; the bodies it got too."""
    control = control or {}
    seen: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        case = body["request_id"]
        if case == "stream":
            text = "".join(f"{line}\n\n" for line in COMPLETIONS["stream"])
            return web.Response(text=text, content_type="text/event-stream")
        return answer(COMPLETIONS[case])

    def route(
        path: str, case: str, facts: dict[str, Any] = CONTROL
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            if request.can_read_body:
                seen.append({"path": request.path_qs, **(await request.json())})
            else:
                seen.append({"path": request.path_qs})
            name = control.get(path, case)
            return answer((LORA if name in LORA else facts)[name])

        return handler

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", completions),
            web.get("/v1/models", route("/v1/models", "models")),
            web.get("/is_paused", route("/is_paused", "is_paused")),
            web.get("/health", route("/health", "health")),
            web.get("/metrics", route("/metrics", "metrics")),
            web.get("/get_world_size", route("/get_world_size", "get_world_size")),
            *(
                web.post(f"/{name}", route(f"/{name}", name))
                for name in ("pause", "resume", "abort_requests", "sleep", "wake_up", "reset_prefix_cache")
            ),
            web.post("/collective_rpc", route("/collective_rpc", "collective_rpc_reload_weights")),
            *(
                web.post(f"/{name}", route(f"/{name}", name))
                for name in ("start_weight_update", "update_weights", "finish_weight_update")
            ),
            web.post("/v1/load_lora_adapter", route("/v1/load_lora_adapter", "load")),
            web.post("/v1/unload_lora_adapter", route("/v1/unload_lora_adapter", "unload")),
        ]
    )

    async def run() -> Any:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        client = VLLMClient(f"http://127.0.0.1:{runner.addresses[0][1]}", retries=0)
        try:
            await client.start()
            seen.clear()  # start's own calls
            return await scenario(client, seen)
        finally:
            await client.close()
            await runner.cleanup()

    return asyncio.run(run())


def request(case: str, params: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """SGLang's ``/generate`` body for the fixture ``case``: six greedy tokens with their log-probs unless
    ``params`` (sampling) and ``extra`` (the body's) say otherwise."""
    params = params or {"max_new_tokens": 6, "temperature": 0.0}
    return {"input_ids": PROMPT, "rid": case, "return_logprob": True, "sampling_params": params, **extra}


def generate(client: VLLMClient, case: str, **extra: Any) -> Awaitable[Any]:
    return client.generate(request(case, **extra))


# ------------------------------------------------------------------ the client reads vLLM's answers


def test_a_completion_becomes_sglangs_answer_with_tokens_and_log_probs():
    async def scenario(client, seen):
        return await generate(client, "single"), seen[-1]

    response, sent = replay(scenario)
    single = choice("single")
    assert response["output_ids"] == single["token_ids"] and response["text"] == single["text"]
    meta = response["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6} and meta["id"] == "single"
    assert [e[:2] for e in meta["output_token_logprobs"]] == [
        [lp, tok] for lp, tok in zip(single["logprobs"]["token_logprobs"], single["token_ids"], strict=True)
    ]
    assert meta["prompt_tokens"] == len(PROMPT) and meta["weight_version"] == "default"
    assert sent == {
        "prompt": PROMPT,
        "request_id": "single",
        "return_token_ids": True,
        "max_tokens": 6,
        "temperature": 0.0,
        "logprobs": 0,
    }


@pytest.mark.parametrize(
    ("case", "reason"), [("stop_eos", type(None)), ("stop_token", int), ("stop_string", str)]
)
def test_a_stop_is_matched_by_its_token_or_string_and_eos_by_its_id(case, reason):
    async def scenario(client, seen):
        return await generate(client, case)

    stopped = choice(case)
    assert stopped["finish_reason"] == "stop" and isinstance(stopped["stop_reason"], reason)
    matched = stopped["token_ids"][-1] if stopped["stop_reason"] is None else stopped["stop_reason"]
    assert replay(scenario)["meta_info"]["finish_reason"] == {"type": "stop", "matched": matched}


def test_an_aborted_request_keeps_its_tokens_with_sglangs_abort():
    async def scenario(client, seen):
        return await generate(client, "aborted")

    response = replay(scenario)
    assert choice("aborted")["finish_reason"] == "abort" and choice("aborted")["token_ids"]
    assert response["output_ids"] == choice("aborted")["token_ids"]
    assert response["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }


def test_top_log_probs_are_read_by_token_id():
    async def scenario(client, seen):
        return await generate(client, "top_logprobs", top_logprobs_num=2), seen[-1]

    response, sent = replay(scenario)
    assert sent["logprobs"] == 2 and sent["return_tokens_as_token_ids"] is True
    top = response["meta_info"]["output_top_logprobs"]
    [first, *_] = choice("top_logprobs")["logprobs"]["top_logprobs"]
    assert top[0] == [[lp, int(token.removeprefix("token_id:")), None] for token, lp in first.items()]
    assert len(top[0]) >= 2


def test_the_trust_probe_reads_prompt_log_probs_and_drops_the_one_token_vllm_must_make():
    async def scenario(client, seen):
        body = request("prompt_logprobs", {"max_new_tokens": 0, "temperature": 1.0}, logprob_start_len=1)
        return await client.generate(body), seen[-1]

    response, sent = replay(scenario)
    assert sent["max_tokens"] == 1 and sent["prompt_logprobs"] == 0
    assert response["output_ids"] == [] and response["text"] == ""
    assert response["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    scored = choice("prompt_logprobs")["prompt_logprobs"]
    assert response["meta_info"]["input_token_logprobs"] == [
        [None, PROMPT[1], None],  # SGLang's first is None
        *([scored[i][str(PROMPT[i])]["logprob"], PROMPT[i], None] for i in range(2, len(PROMPT))),
    ]


def test_a_stream_of_deltas_becomes_sglangs_cumulative_stream():
    async def scenario(client, seen):
        body = request("stream", {"max_new_tokens": 3})
        return [chunk async for chunk in client.generate_stream(body)], seen[-1]

    chunks, sent = replay(scenario)
    assert sent["stream"] is True
    deltas = [json.loads(line[len("data: ") :])["choices"][0] for line in COMPLETIONS["stream"][:-1]]
    assert len(deltas) == 3 and COMPLETIONS["stream"][-1] == "data: [DONE]"
    assert [c["output_ids"] for c in chunks] == [
        [t for d in deltas[: i + 1] for t in d["token_ids"]] for i in range(3)
    ]
    assert [c["text"] for c in chunks] == ["".join(d["text"] for d in deltas[: i + 1]) for i in range(3)]
    assert [c["meta_info"]["finish_reason"] for c in chunks] == [None, None, {"type": "length", "length": 3}]
    assert len(chunks[-1]["meta_info"]["output_token_logprobs"]) == 3


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("bad_request", "answered 400: 1 validation error"),
        ("unknown_model", "answered 404: The model `no-such-adapter` does not exist"),
        ("unauthorized", "answered 401: Unauthorized"),
    ],
)
def test_vllms_error_answers_are_request_errors_with_its_message(case, words):
    async def scenario(client, seen):
        await generate(client, case)

    with pytest.raises(EngineRequestError, match=words):
        replay(scenario)


def test_control_calls_read_vllms_answers():
    async def scenario(client, seen):
        await client.abort("r1")
        await client.abort()
        await client.pause("abort")
        await client.pause("in_place")
        await client.resume()
        load = await client.load()
        flushed = await client.flush_cache()
        await client.update_weights_from_disk("/runs/step-3", "3")
        info = await client.model_info()
        return load, flushed, info, [s for s in seen if "path" in s]

    load, flushed, info, sent = replay(scenario)
    gauges = {
        line.split("{")[0]: int(float(line.rsplit(" ", 1)[1]))
        for line in CONTROL["metrics"][1].splitlines()
        if line.startswith("vllm:num_requests_")
    }
    assert load == {
        "num_running_reqs": gauges["vllm:num_requests_running"],
        "num_waiting_reqs": gauges["vllm:num_requests_waiting"],
    }
    assert load["num_running_reqs"] > 0 and flushed is True  # taken while requests ran
    assert info["weight_version"] == "3" and info["model_path"] == CONTROL["models"][1]["data"][0]["root"]
    assert sent[:5] == [
        {"path": "/abort_requests", "request_ids": ["cmpl-r1-0"]},
        {"path": "/abort_requests", "request_ids": []},
        {"path": "/pause?mode=abort"},
        {"path": "/pause?mode=keep"},
        {"path": "/resume"},
    ]
    assert {
        "path": "/collective_rpc",
        "method": "reload_weights",
        "kwargs": {"weights_path": "/runs/step-3"},
    } in sent


@pytest.mark.parametrize(
    "call,route,case,answer",
    [
        ("flush_cache", "/reset_prefix_cache", "reset_prefix_cache_busy", False),  # a busy cache: not flushed
        ("weight_checksums", "/collective_rpc", "collective_rpc_unknown_method", None),  # no worker extension
    ],
)
def test_what_vllm_cannot_do_is_the_clients_plain_no(call, route, case, answer):
    async def scenario(client, seen):
        return await getattr(client, call)()

    assert replay(scenario, {route: case}) is answer


def test_weight_checksums_come_per_worker_with_vllms_fusions():
    async def scenario(client, seen):
        return await client.weight_checksums()

    [served] = replay(scenario, {"/collective_rpc": "rlsdk_weight_checksums"})
    assert isinstance(served, ServedChecksums) and served.tp_size == 1
    assert served.layout == {
        ".qkv_proj.": (".q_proj.", ".k_proj.", ".v_proj."),
        ".gate_up_proj.": (".gate_proj.", ".up_proj."),
    }
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    [worker] = CONTROL["rlsdk_weight_checksums"][1]["results"]
    assert served.checksums[qkv] == worker["checksums"][qkv] and len(served.checksums) == len(
        worker["checksums"]
    )


def test_a_server_without_the_rl_routes_is_refused_at_start():
    async def scenario(client, seen):
        raise AssertionError("started")

    with pytest.raises(EngineError, match="no RL routes .* start it with VLLM_SERVER_DEV_MODE=1"):
        replay(scenario, {"/is_paused": "no_dev_mode"})


def test_a_weight_update_on_a_server_without_a_transfer_backend_says_so():
    async def scenario(client, seen):
        async def no_buckets():
            return
            yield

        await client.update_weights_from_tensor(no_buckets(), "1")

    with pytest.raises(EngineError, match="Weight transfer not configured"):
        replay(scenario, {"/start_weight_update": "weight_transfer_not_configured"})


def test_lora_answers_are_read_and_requests_name_the_adapter():
    async def scenario(client, seen):
        await client.load_lora_adapter("rlsdk_v1", "/runs/x/disk-sync/rlsdk_v1")
        await generate(client, "single")
        await client.unload_lora_adapter("rlsdk_v1")
        await generate(client, "single")
        return seen

    seen = replay(scenario)
    assert seen[0] == {
        "path": "/v1/load_lora_adapter",
        "lora_name": "rlsdk_v1",
        "lora_path": "/runs/x/disk-sync/rlsdk_v1",
    }
    assert seen[1]["model"] == "rlsdk_v1" and "model" not in seen[3]


@pytest.mark.parametrize(
    ("route", "case"),
    [("/v1/load_lora_adapter", "load_again"), ("/v1/unload_lora_adapter", "unload_missing")],
)
def test_lora_refusals_are_request_errors(route, case):
    async def scenario(client, seen):
        if "unload" in route:
            await client.unload_lora_adapter("rlsdk_v1")
        else:
            await client.load_lora_adapter("rlsdk_v1", "/a")

    with pytest.raises(EngineRequestError, match=LORA[case][1]["error"]["message"][:30]):
        replay(scenario, {route: case})


# ------------------------------------------------------------------ what the client sends


def test_sampling_parameters_are_translated_or_refused_by_name():
    payload = {
        "input_ids": [5, 6],
        "sampling_params": {
            "max_new_tokens": 9,
            "min_new_tokens": 2,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "stop": ["</s>"],
            "stop_token_ids": [2],
            "no_stop_trim": True,
            "sampling_seed": 11,
            "json_schema": '{"type": "object"}',
        },
    }
    body = completion_request(payload, "r", None).body
    assert body == {
        "prompt": [5, 6],
        "request_id": "r",
        "return_token_ids": True,
        "max_tokens": 9,
        "min_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "stop": ["</s>"],
        "stop_token_ids": [2],
        "include_stop_str_in_output": True,
        "seed": 11,
        "structured_outputs": {"json": {"type": "object"}},
    }
    assert completion_request({"text": "hi"}, "r", "adapter").body["max_tokens"] == 128  # SGLang's default
    with pytest.raises(EngineRequestError, match="sampling parameter 'custom_params'"):
        completion_request({"input_ids": [1], "sampling_params": {"custom_params": {}}}, "r", None)
    with pytest.raises(EngineRequestError, match="prompt log-probs .* cannot be streamed"):
        completion_request(
            {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 1}, "r", None, stream=True
        )


# ------------------------------------------------------------------ the stand-in answers in vLLM's shapes


def same_shape(ours: Any, theirs: Any, where: str = "answer") -> None:
    """The same keys in the same order and the same JSON types (None matches anything)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (
            f"{where}: {list(ours)} != {list(theirs)}"
        )
        for key in theirs:
            same_shape(ours[key], theirs[key], f"{where}.{key}")
    elif theirs is not None and ours is not None:
        assert type(ours) is type(theirs) or {type(ours), type(theirs)} <= {int, float}, where


@pytest.fixture
def stand_in(tiny_llama: Path, tmp_path: Path):
    from rlsdk_embedded.engine import EmbeddedEngine

    engine = EmbeddedEngine(str(tiny_llama), device="cpu", threads=1)
    with ServedVLLM(engine, str(tiny_llama), socket=str(tmp_path / "vllm.sock")) as served:
        yield served


def test_the_stand_in_answers_in_the_restated_shapes_over_a_unix_socket(stand_in, tiny_llama: Path):
    import aiohttp

    async def ask() -> dict[str, Any]:
        out: dict[str, Any] = {}
        connector = aiohttp.UnixConnector(path=stand_in.socket)
        async with aiohttp.ClientSession(connector=connector) as http:
            body = {
                "prompt": [2, 3, 4],
                "max_tokens": 3,
                "logprobs": 0,
                "return_token_ids": True,
                "request_id": "x",
            }
            async with http.post("http://localhost/v1/completions", json=body) as r:
                out["single"] = await r.json()
            async with http.post("http://localhost/v1/completions", json={**body, "stream": True}) as r:
                out["stream"] = [line.strip() for line in (await r.text()).splitlines() if line.strip()]
            async with http.get("http://localhost/v1/models") as r:
                out["models"] = await r.json()
            async with http.post("http://localhost/pause?mode=retract") as r:
                out["pause_bad_mode"] = [r.status, await r.json()]
        client = VLLMClient(socket=stand_in.socket)
        await client.start()
        out["generated"] = await client.generate(
            {"input_ids": [2, 3], "sampling_params": {"max_new_tokens": 2}}
        )
        await client.close()
        return out

    out = asyncio.run(ask())
    same_shape(out["single"], COMPLETIONS["single"][1])
    first, theirs = json.loads(out["stream"][0][6:]), json.loads(COMPLETIONS["stream"][0][6:])
    same_shape(first, theirs, "stream chunk")
    assert out["stream"][-1] == "data: [DONE]"
    same_shape(out["models"], CONTROL["models"][1])
    assert out["pause_bad_mode"][0] == 400 and out["pause_bad_mode"][1]["error"]["param"] == "mode"
    assert len(out["generated"]["output_ids"]) == 2
