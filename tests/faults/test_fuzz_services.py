"""Fuzzing every route of every HTTP service in core (issues 43 and 47) with hypothesis, over real HTTP on
loopback (:mod:`.fuzzing`): ``rlsdk serve``'s engine routes with its OpenAI chat, Anthropic messages and
session routes, the chat server in front of any engine (``start_chat_server``), ``rlsdk buffer serve``,
``rlsdk view`` and ``rlsdk tinker serve``.
Random, mutated, re-encoded and costly bodies (millions of tiny values, thousands of levels, megabytes of
text) never get a 500, never stall a server's event loop for a second, never grow memory past a bound,
and a request without the token changes nothing. Each service runs in a process of its
own (``fuzz_target.py``); the engine behind the servers is :class:`rlsdk.testing.FakeEngine` (the HTTP
layer is fuzzed, not a model)."""

from __future__ import annotations

import httpx
import pytest

from .fuzzing import REFUSED, FuzzTarget, costly_examples, fuzz, send

TOKEN = "fuzz-token-0123456789abcdef"

ENGINE_SEEDS = [
    {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
    {"text": "w1 w2", "sampling_params": {"temperature": 0.5, "top_p": 0.9, "stop": ["w3"]}, "stream": True},
    {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2},
    {
        "messages": [{"role": "user", "content": "w1"}],
        "max_tokens": 2,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    },
    {
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "w1"}]}],
        "system": "s",
    },
    {
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "w1"}],
        "tools": [{"name": "f", "input_schema": {}}],
    },
    {"rid": "r1"},
    {"model_path": "/tmp"},
    {"lora_name": "a", "lora_path": "/tmp"},
    {"new_version": "3"},
    {"mode": "in_place"},
]
BUFFER_SEEDS = [
    {
        "instance_id": "a",
        "uid": "a-0",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
    },
    {"task_type": "math", "num_repeat_per_sample": 2},
    {"max_groups": 1, "lease_seconds": 5},
    {"lease_id": "x"},
]
DEEP = ("[" * 5000 + "]" * 5000).encode()
HUGE_REWARD = (
    b'{"instance_id": "a", "reward": ' + b"9" * 400 + b', "messages": [{"role": "user", "content": "Q"}, '
    b'{"role": "assistant", "content": "A"}]}'
)


@pytest.mark.parametrize("kind", ["engine", "chat"])
def test_fuzzing_every_route_of_rlsdk_serve_and_the_chat_server(tmp_path, kind):
    """``engine``: ``rlsdk serve``'s server (engine, chat, messages and session routes); ``chat``: the chat
    server of ``start_chat_server`` in front of an engine."""
    with FuzzTarget(kind, tmp_path) as target:
        assert ("POST", "/v1/messages") in target.routes and ("POST", "/v1/chat/completions") in target.routes
        examples = [("POST", "/v1/chat/completions", {}, DEEP), *costly_examples(target.routes)]
        if kind == "engine":
            examples.append(("POST", "/generate", {}, DEEP))
        fuzz(target, seeds=ENGINE_SEEDS, examples=examples)
        assert httpx.get(target.url + "/health").status_code == 200


def test_fuzzing_rlsdk_serve_without_the_token_changes_nothing(tmp_path):
    with FuzzTarget("engine", tmp_path, token=TOKEN) as target:
        before = target.ask()["state"]

        def refused(request, answer):
            assert answer.status_code in REFUSED, (request[:3], answer.status_code)

        fuzz(target, seeds=ENGINE_SEEDS, check=refused)
        assert target.ask()["state"] == before  # no pause, no generation, no session


def test_fuzzing_every_route_of_the_buffer_and_without_the_token_changes_nothing(tmp_path):
    with (
        FuzzTarget("buffer", tmp_path / "open") as served,
        FuzzTarget("buffer", tmp_path / "guarded", token=TOKEN) as locked,
        httpx.Client(timeout=60) as client,
    ):

        def answered_and_refused_without_the_token(request, answer):
            assert answer.status_code < 500, (request[:3], answer.status_code, answer.text[:300])
            method, path, headers, body = request
            headers = {k: v for k, v in headers.items() if k != "Authorization"}
            refused = send(client, locked.url, (method, path, headers, body))
            assert refused.status_code in REFUSED, (request[:3], refused.status_code)

        examples = [("POST", "/buffer/write", {}, DEEP), ("POST", "/buffer/write", {}, HUGE_REWARD)]
        fuzz(
            served,
            seeds=BUFFER_SEEDS,
            check=answered_and_refused_without_the_token,
            examples=[*examples, *costly_examples(served.routes)],
        )
        assert client.post(served.url + "/get_rollout_data", json={}).status_code == 200
        assert locked.ask()["state"] == {
            "written": 0,
            "pending_items": 0,
            "pending_groups": 0,
            "leased_groups": 0,
        }


def test_fuzzing_every_route_of_rlsdk_view(tmp_path):
    """The viewer reads GET requests (query strings fuzzed) with its token; without it every one is 401."""
    with FuzzTarget("view", tmp_path, token=TOKEN, send_token=True) as target:
        assert ("GET", "/api/runs/0/steps/0") in target.routes
        fuzz(target, seeds=[{}])
        answer = httpx.get(target.url + "/api/runs/0", headers=target.headers)
        assert answer.status_code == 200, answer.text


TINKER_SEEDS = [
    {"base_model": "test/tiny-llama", "lora_config": {"rank": 4}, "session_id": "s", "model_seq_id": 0},
    {"model_id": "m", "adam_params": {"learning_rate": 0.001}},
    {
        "sampling_session_id": "s",
        "prompt": {"chunks": [{"tokens": [2, 3], "type": "encoded_text"}]},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 2},
    },
    {"request_id": "r"},
    {"session_id": "s"},
    {"tags": ["a"], "user_metadata": {}, "sdk_version": "0.38.0"},
]


def test_fuzzing_every_route_of_rlsdk_tinker_serve(tmp_path):
    """The Tinker-compatible API (its JSON routes read under a budget of their own) with its API key."""
    pytest.importorskip("tinker")  # the tinker extra: the API's wire schema comes from the pinned SDK
    with FuzzTarget("tinker", tmp_path, token="tml-fuzz-key-0123456789abcdef", send_token=True) as target:
        assert ("POST", "/api/v1/asample") in target.routes
        fuzz(target, seeds=TINKER_SEEDS, examples=list(costly_examples(target.routes)))
        answer = httpx.get(target.url + "/api/v1/healthz", headers=target.headers)
        assert answer.status_code == 200, answer.text
