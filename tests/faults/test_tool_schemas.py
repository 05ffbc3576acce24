"""Tool schemas a client sends (issue 47: 9): one that is not an object used to get a 500 (the tools prompt
read it as a dict), and a boolean sub-schema, valid JSON Schema, too. Real HTTP on loopback to the chat and
messages routes; the engine is :class:`rlsdk.testing.FakeEngine` (the request's checks are tested)."""

from __future__ import annotations

import httpx
import pytest

from rlsdk.testing import ServedEngine

from .conftest import RecordingEngine
from .test_sizes_before_work import chat_body


@pytest.fixture(params=["tools prompt", "template"], scope="module")
def served(request, chat_tokenizer, word_tokenizer):
    """A server whose template renders no tools (the tool-call parser's prompt describes them), or one that
    writes them out as JSON."""
    from transformers import AutoTokenizer

    from .conftest import TOOLS_CHAT_TEMPLATE

    tokenizer = chat_tokenizer
    if request.param == "template":
        tokenizer = AutoTokenizer.from_pretrained(word_tokenizer)
        tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
    with ServedEngine(RecordingEngine(tokenizer)) as served:
        yield served


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("schema", [[1, 2], "object", 7, True, {"type": "object", "properties": [1]}])
def test_a_tool_schema_that_is_not_an_object_is_a_400_naming_it(served, route, schema):
    answer = httpx.post(served.url + route, json=chat_body(route, schema), timeout=60)
    assert answer.status_code == 400, answer.text
    assert "schema" in answer.text and ("parameters" in answer.text or "input_schema" in answer.text)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": True, "y": False}},
        {"type": "object", "properties": {"x": {"type": "object", "properties": {"z": True}}}},
        {"type": "object", "additionalProperties": False, "properties": {"x": {"items": True}}},
    ],
)
def test_boolean_sub_schemas_are_served(served, route, schema):
    answer = httpx.post(served.url + route, json=chat_body(route, schema), timeout=60)
    assert answer.status_code == 200, answer.text
