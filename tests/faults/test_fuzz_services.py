"""Fuzzing every HTTP service (issue item 4) with hypothesis, over real HTTP on loopback, bounded in
examples and time: random and mutated bodies, headers and paths never get a 500, never crash or hang the
server, and a request without the token changes nothing. The engine behind ``rlsdk serve``'s server is
:class:`rlsdk.testing.FakeEngine` (the HTTP layer is fuzzed, not a model)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlsdk import get_plugin_manager
from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore
from rlsdk.testing import ServedBuffer, ServedEngine

from .conftest import RecordingEngine

TOKEN = "fuzz-token-0123456789abcdef"
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)

ENGINE_PATHS = [
    "/generate",
    "/abort_request",
    "/pause_generation",
    "/continue_generation",
    "/flush_cache",
    "/update_weights_from_disk",
    "/model_info",
    "/health",
    "/health_generate",
    "/v1/loads",
    "/v1/models",
    "/v1/chat/completions",
    "/sessions",
    "/sessions/x",
    "/sessions/x/v1/chat/completions",
    "/get_weight_version",
]
BUFFER_PATHS = [
    "/start_rollout",
    "/buffer/write",
    "/get_rollout_data",
    "/ack_rollout_data",
    "/release_rollout_data",
]
SEEDS = [
    {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
    {"text": "w1 w2", "sampling_params": {"temperature": 0.5, "top_p": 0.9, "stop": ["w3"]}, "stream": True},
    {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2},
    {
        "instance_id": "a",
        "uid": "a-0",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
    },
    {"max_groups": 1, "lease_seconds": 5},
    {"rid": "r1"},
    {"model_path": "/tmp"},
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**400)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def bodies(draw):
    """A seed body with some of its values replaced, random JSON, or random bytes."""
    kind = draw(st.sampled_from(["mutated", "json", "bytes", "deep"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.integers(min_value=50, max_value=5000))
        return ("[" * depth + "]" * depth).encode()
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    body = dict(draw(st.sampled_from(SEEDS)))
    for key in draw(
        st.lists(st.sampled_from([*body, "stream", "n", "tools", "sampling_params"]), max_size=3)
    ):
        body[key] = draw(json_values)
    return json.dumps(body).encode()


@st.composite
def requests(draw, paths):
    """Mostly requests that pass the guard (so that the handlers are fuzzed), some that do not."""
    path = draw(st.sampled_from(paths) | st.text(alphabet="/abcxyz_.%0123456789", min_size=1, max_size=30))
    if not path.startswith("/"):
        path = "/" + path
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "DELETE", "PUT"]))
    headers = {}
    if draw(st.integers(0, 3)) == 0:
        headers["Content-Type"] = draw(
            st.sampled_from(["text/plain", "application/json; charset=utf-8", "x/y"])
        )
    if draw(st.integers(0, 3)) == 0:
        headers["Authorization"] = draw(st.sampled_from(["Bearer x", "Basic abc", ""]))
    if draw(st.integers(0, 3)) == 0:
        headers["Host"] = draw(
            st.sampled_from(["localhost", "evil.example", "[::1]:1", "127.0.0.1:80", "a b"])
        )
    return method, path, headers, draw(bodies())


DEEP = ("[" * 5000 + "]" * 5000).encode()
HUGE_REWARD = (
    b'{"instance_id": "a", "reward": ' + b"9" * 400 + b', "messages": [{"role": "user", "content": "Q"}, '
    b'{"role": "assistant", "content": "A"}]}'
)


def send(client: httpx.Client, url: str, request) -> httpx.Response:
    method, path, headers, body = request
    return client.request(method, url + path, content=body, headers=headers)


@pytest.fixture(scope="module")
def served_engine(chat_tokenizer):
    with ServedEngine(RecordingEngine(chat_tokenizer)) as served:
        yield served


@pytest.fixture(scope="module")
def guarded_engine(chat_tokenizer):
    with ServedEngine(RecordingEngine(chat_tokenizer), token=TOKEN) as served:
        yield served


def test_fuzzing_the_engine_server_never_gives_a_500(served_engine):
    with httpx.Client(timeout=30) as client:

        @FUZZ
        @given(requests(ENGINE_PATHS))
        @example(("POST", "/generate", {}, DEEP))
        @example(("POST", "/v1/chat/completions", {}, DEEP))
        def check(request):
            answer = send(client, served_engine.url, request)
            assert answer.status_code < 500, (request, answer.status_code, answer.text[:300])

        check()
        assert client.get(served_engine.url + "/health").status_code == 200


def test_fuzzing_the_engine_server_without_the_token_changes_nothing(guarded_engine):
    engine = guarded_engine.engine
    before = (engine.pauses, engine.requests, len(guarded_engine.handle.chat.sessions))
    with httpx.Client(timeout=30) as client:

        @FUZZ
        @given(requests(ENGINE_PATHS))
        def check(request):
            method, path, headers, body = request
            answer = send(client, guarded_engine.url, (method, path, headers, body))
            assert answer.status_code in (401, 403, 415, 421), (request, answer.status_code)

        check()
    assert (engine.pauses, engine.requests, len(guarded_engine.handle.chat.sessions)) == before


def test_fuzzing_the_buffer_never_gives_a_500_and_without_the_token_changes_nothing(tmp_path):
    open_service = BufferService(
        get_plugin_manager(load_entrypoints=False), TrajectoryStore(tmp_path / "open")
    )
    guarded = BufferService(get_plugin_manager(load_entrypoints=False), TrajectoryStore(tmp_path / "guarded"))
    with ServedBuffer(open_service) as served, ServedBuffer(guarded, token=TOKEN) as locked:
        with httpx.Client(timeout=30) as client:

            @FUZZ
            @given(requests(BUFFER_PATHS))
            @example(("POST", "/buffer/write", {}, DEEP))
            @example(("POST", "/buffer/write", {}, HUGE_REWARD))
            def check(request):
                answer = send(client, served.url, request)
                assert answer.status_code < 500, (request, answer.status_code, answer.text[:300])
                method, path, headers, body = request
                headers = {k: v for k, v in headers.items() if k != "Authorization"}
                refused = send(client, locked.url, (method, path, headers, body))
                assert refused.status_code in (401, 403, 415, 421), (request, refused.status_code)

            check()
            assert client.post(served.url + "/get_rollout_data", json={}).status_code == 200
        assert guarded.store.counts() == {
            "written": 0,
            "pending_items": 0,
            "pending_groups": 0,
            "leased_groups": 0,
        }
