"""Protocol truth: ``rlsdk serve`` and the SGLang client held to responses captured from a real
SGLang 0.5.17 server (copied into ``fixtures/sglang-0.5.17.json``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from rlsdk.engine_api import EngineRequestError, SGLangClient
from rlsdk.testing import ServedEngine

FACTS = json.loads((Path(__file__).parent / "fixtures" / "sglang-0.5.17.json").read_text())
SINGLE = FACTS["single"][1]


@pytest.fixture(scope="module")
def served():
    import torch

    EmbeddedEngine = pytest.importorskip("rlsdk_embedded").EmbeddedEngine

    torch.set_num_threads(2)
    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        yield served


def post(served, body, path="/generate"):
    return httpx.post(f"{served.url}{path}", json=body, timeout=120)


def greedy(served, prompt=(1, 504, 3458, 30), **params):
    body = {"input_ids": list(prompt), "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 6, **params}}
    response = post(served, body)
    assert response.status_code == 200
    return response.json()


def assert_same_shape(ours, theirs, where="response"):
    """Same keys in the same order, and the same JSON types (None only where SGLang sent None)."""
    assert list(ours) == list(theirs), f"{where} keys differ"
    for key, value in theirs.items():
        if key in ("finish_reason", "cached_tokens_details"):
            continue  # checked per case: their shape depends on how the request ended / the cache
        assert type(ours[key]) is type(value), f"{where}.{key}: {type(ours[key]).__name__} != {type(value).__name__}"


# ------------------------------------------------------------------ rlsdk serve


def test_health_is_an_empty_200(served):
    response = httpx.get(f"{served.url}/health", timeout=30)
    assert [response.status_code, response.text] == FACTS["health"]
    assert httpx.get(f"{served.url}/health_generate", timeout=60).status_code == 200


def test_model_info_carries_weight_version_under_both_names(served):
    theirs = FACTS["model_info"][1]
    for path in ("/model_info", "/get_model_info"):
        ours = httpx.get(f"{served.url}{path}", timeout=30).json()
        assert_same_shape({k: ours[k] for k in theirs}, theirs, path)
        assert ours["weight_version"] == "default"


def test_get_weight_version_is_gone_as_in_0_5_17(served):
    status, body = FACTS["weight_version"]
    response = httpx.get(f"{served.url}/get_weight_version", timeout=30)
    assert response.status_code == status and response.json() == body


def test_single_response_fields_and_types(served):
    ours = greedy(served, max_new_tokens=40)
    assert_same_shape(ours, SINGLE)
    assert_same_shape(ours["meta_info"], SINGLE["meta_info"], "meta_info")
    assert ours["meta_info"]["output_token_logprobs_length"] == len(ours["output_ids"])
    for entry, theirs in zip(ours["meta_info"]["output_token_logprobs"], SINGLE["meta_info"]["output_token_logprobs"]):
        assert [type(x) for x in entry] == [type(x) for x in theirs]  # [float, int, None]


def test_eos_matches_by_id_and_stays_in_output_ids_not_text(served):
    chat = served.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, return_dict=True)["input_ids"]
    ours = greedy(served, chat, max_new_tokens=60)
    theirs = SINGLE["meta_info"]["finish_reason"]
    assert ours["meta_info"]["finish_reason"] == {"type": "stop", "matched": ours["output_ids"][-1]}
    assert type(theirs["matched"]) is int and SINGLE["output_ids"][-1] == theirs["matched"]
    assert "<|im_end|>" not in ours["text"]


def test_batch_gives_a_list_with_length_finish(served):
    theirs = FACTS["batch"][1]
    body = {"input_ids": [[1, 504, 3458], [1, 504, 3458, 30]], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    ours = post(served, body).json()
    assert isinstance(ours, list) and len(ours) == len(theirs)
    for mine, real in zip(ours, theirs):
        assert_same_shape(mine["meta_info"], real["meta_info"], "meta_info")
        assert mine["meta_info"]["finish_reason"] == real["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


def test_stop_string_is_trimmed_even_inside_a_token(served):
    theirs = FACTS["text_stop"][1]
    assert isinstance(theirs["meta_info"]["finish_reason"]["matched"], str) and len(theirs["output_ids"]) == 1
    free = greedy(served)
    first = served.engine.tokenizer.decode(free["output_ids"][:1])
    assert len(first.strip()) >= 2, "the first token should have at least two letters"
    stop = first.strip()[1:]  # starts inside the first token
    ours = greedy(served, stop=[stop])
    assert ours["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert ours["output_ids"] == free["output_ids"][:1]
    assert ours["text"] == first[: first.index(stop)]


def test_stop_token_is_in_output_ids_but_not_in_text(served):
    theirs = FACTS["stop_token"][1]
    assert theirs["text"] == "" and theirs["output_ids"] == [theirs["meta_info"]["finish_reason"]["matched"]]
    first = greedy(served)["output_ids"][0]
    ours = greedy(served, stop_token_ids=[first])
    assert ours["text"] == "" and ours["output_ids"] == [first]
    assert ours["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}


def test_abort_shape(served):
    async def scenario():
        client = SGLangClient(served.url)
        try:
            steps = served.engine.stats.steps
            task = asyncio.create_task(client.generate({"input_ids": [1, 2], "sampling_params": {
                "max_new_tokens": 500, "ignore_eos": True}}))
            while served.engine.stats.steps < steps + 2:  # prefilled and decoding: some tokens to return
                await asyncio.sleep(0.05)
            response = await client.http.request("POST", "/abort_request", body={"abort_all": True})
            return response, await task
        finally:
            await client.close()

    response, out = asyncio.run(scenario())
    assert [response.status_code, response.text] == FACTS["abort_call"]
    assert out["meta_info"]["finish_reason"] == FACTS["aborted_finish_reason"]
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) > 0


def test_stream_is_cumulative_and_ends_with_done(served):
    theirs = [json.loads(line[len("data: "):]) for line in FACTS["stream"][:-1]]
    assert FACTS["stream"][-1] == "data: [DONE]"
    body = {"input_ids": [1, 504, 3458], "stream": True, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
    with httpx.stream("POST", f"{served.url}/generate", json=body, timeout=120) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert len(chunks) == 6
    assert_same_shape(chunks[0]["meta_info"], theirs[0]["meta_info"], "first chunk meta_info")
    assert_same_shape(chunks[1]["meta_info"], theirs[1]["meta_info"], "second chunk meta_info")
    for before, after in zip(chunks, chunks[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * 5
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_bad_request_shape(served):
    status, theirs = FACTS["bad_request"]
    response = post(served, {"input_ids": "not a list"})
    assert response.status_code == status
    ours = response.json()
    assert list(ours) == list(theirs)
    assert {k: ours[k] for k in ("object", "type", "param", "code")} == {k: theirs[k] for k in ("object", "type", "param", "code")}
    assert "must be list or null; got str" in ours["message"]


def test_flush_cache_text(served):
    response = httpx.get(f"{served.url}/flush_cache", timeout=30)
    assert [response.status_code, response.text] == FACTS["flush_get"]


def test_loads_shape(served):
    ours = httpx.get(f"{served.url}/v1/loads?include=core", timeout=30).json()
    theirs = FACTS["loads"][1]
    assert {"timestamp", "version", "loads"} <= set(ours)
    keys = {"timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs"}
    assert keys <= set(theirs["loads"][0]) and keys <= set(ours["loads"][0])


# ------------------------------------------------------------------ the SGLang client


@pytest.fixture
def replay():
    """SGLang needs a GPU, so this stand-in answers with the bodies the real 0.5.17 server sent."""

    def answer(key):
        async def handler(request):
            status, body = FACTS[key]
            if isinstance(body, str):
                return web.Response(text=body, status=status)
            return web.json_response(body, status=status)
        return handler

    async def generate(request):
        body = await request.json()
        if not isinstance(body.get("input_ids"), list):
            return await answer("bad_request")(request)
        if body.get("stream"):
            return web.Response(text="".join(f"{line}\n\n" for line in FACTS["stream"]),
                                content_type="text/event-stream")
        return await answer("batch" if isinstance(body["input_ids"][0], list) else "single")(request)

    app = web.Application()
    app.add_routes([
        web.get("/model_info", answer("model_info")), web.get("/get_weight_version", answer("weight_version")),
        web.post("/generate", generate), web.post("/abort_request", answer("abort_call")),
        web.get("/flush_cache", answer("flush_get")), web.get("/v1/loads", answer("loads")),
    ])

    async def run(scenario):
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        client = SGLangClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
        try:
            return await scenario(client)
        finally:
            await client.close()
            await runner.cleanup()

    return lambda scenario: asyncio.run(run(scenario))


def test_client_reads_real_responses(replay):
    async def scenario(client):
        single = await client.generate({"input_ids": [1, 2]})
        batch = await client.generate({"input_ids": [[1], [2]]})
        chunks = [c async for c in client.generate_stream({"input_ids": [1, 2]})]
        return single, batch, chunks, await client.weight_version(), await client.load()

    single, batch, chunks, version, load = replay(scenario)
    assert single == SINGLE and batch == FACTS["batch"][1]
    assert [c["output_ids"] for c in chunks] == [json.loads(line[6:])["output_ids"] for line in FACTS["stream"][:-1]]
    assert version == "default" and load == {"num_running_reqs": 0, "num_waiting_reqs": 0}


def test_client_control_calls_accept_real_answers(replay):
    async def scenario(client):
        await client.abort()
        await client.abort("some-rid")
        return await client.flush_cache(), await client.workers()

    flushed, workers = replay(scenario)
    assert flushed is True and len(workers) == 1


def test_client_turns_a_real_400_into_a_request_error(replay):
    async def scenario(client):
        await client.generate({"input_ids": "not a list"})

    with pytest.raises(EngineRequestError, match="must be list or null; got str"):
        replay(scenario)


def test_request_body_size_is_limited():
    """``rlsdk serve --max-body``: a body over the limit is SGLang's 413 before the engine sees it."""
    from rlsdk.testing import FakeEngine

    with ServedEngine(FakeEngine(["never asked"]), max_body=1024) as small:
        response = httpx.post(f"{small.url}/generate", json={"input_ids": [1] * 2000}, timeout=30)
    assert response.status_code == 413 and response.json()["code"] == 413
