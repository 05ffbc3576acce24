"""Sizes are checked before any chat template or tokenizer work (S10, D1), and a folder given as the data
file is named as one (D5). Real HTTP on loopback; the engine is :class:`rlsdk.testing.FakeEngine` (the
checks before generation are tested, not a model)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from rlsdk import RolloutConfig
from rlsdk.data import DataSource
from rlsdk.errors import DataError
from rlsdk.testing import ByteTokenizer, ServedEngine

from .conftest import TOOLS_CHAT_TEMPLATE, RecordingEngine
from .fuzzing import MAX_STALL, LoopWatch


def stall_limit(body: bytes) -> float:
    """The most a request with ``body`` may hold up the server's loop: :data:`MAX_STALL` beyond what parsing
    the body and counting its characters costs here and now (process CPU time, as :class:`LoopWatch` counts
    a stall). A body the route must read can take that long; on two cores shared with the rest of the suite
    both grow together (a nested-list schema stalled 0.4 s on idle cores, 0.7 s beside three busy processes
    and 1.1 s in a loaded CI run). The 200,000 text blocks cost about 0.33 s to parse and count; joined one by
    one, as before the fix, they stalled the loop 1.7 s."""
    from rlsdk.sizes import json_chars

    started = time.process_time()
    json_chars(json.loads(body), len(body))
    return MAX_STALL + time.process_time() - started


class CountingTokenizer(ByteTokenizer):
    """Bytes as token ids; remembers the longest text it was asked to tokenize."""

    longest = 0

    def __call__(self, text, add_special_tokens=False):
        texts = text if isinstance(text, list) else [text]
        self.longest = max([self.longest, *map(len, texts)])
        return super().__call__(text, add_special_tokens)


def test_an_oversized_chat_message_is_refused_before_the_template(chat_tokenizer, monkeypatch):
    with ServedEngine(RecordingEngine(chat_tokenizer)) as served:
        chat = served.handle.chat
        rendered = []
        original = chat.template.prompt_ids
        monkeypatch.setattr(chat.template, "prompt_ids", lambda *a: rendered.append(1) or original(*a))
        huge = {"messages": [{"role": "user", "content": "w1 " * 400_000}], "max_tokens": 1}
        answer = httpx.post(served.url + "/v1/chat/completions", json=huge, timeout=60)
        assert answer.status_code == 400, answer.text
        assert "characters" in answer.json()["error"]["message"]
        assert rendered == [] and served.engine.requests == 0
        small = {"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 1}
        assert httpx.post(served.url + "/v1/chat/completions", json=small, timeout=60).status_code == 200


@pytest.fixture
def tools_chat_tokenizer(word_tokenizer):
    """The word tokenizer with a template that writes the tool schemas out as JSON (as Qwen's does)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer)
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
    return tokenizer


def chat_body(route, tools):
    messages = [{"role": "user", "content": "w1"}]
    if route == "/v1/messages":
        return {"max_tokens": 1, "messages": messages, "tools": [{"name": "f", "input_schema": tools}]}
    return {
        "max_tokens": 1,
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": tools}}],
    }


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("shape", ["numbers", "nested lists"])
def test_numbers_and_brackets_in_a_tool_schema_count_before_the_template(
    tools_chat_tokenizer, monkeypatch, route, shape
):
    """The size check counted only the strings: a tool schema of 600,000 numbers (a 1.8 MB request) or of
    nested lists went through the template (written out as JSON, seconds of a frozen loop) and the tokenizer."""
    with ServedEngine(RecordingEngine(tools_chat_tokenizer)) as served:
        chat = served.handle.chat
        rendered = []
        original = chat.template.prompt_ids
        monkeypatch.setattr(chat.template, "prompt_ids", lambda *a: rendered.append(1) or original(*a))
        values = [1] * 600_000 if shape == "numbers" else [[[0]]] * 200_000
        schema = {"type": "object", "properties": {"x": {"enum": values}}}
        body = json.dumps(chat_body(route, schema)).encode()
        with LoopWatch(served.run(running_loop())) as watch:
            answer = httpx.post(served.url + route, content=body, timeout=120)
        assert answer.status_code == 400 and "characters" in answer.text, answer.text[:300]
        assert rendered == [] and served.engine.requests == 0
        limit = stall_limit(body)
        assert watch.worst < limit, f"the loop stalled {watch.worst:.2f}s (limit {limit:.2f}s)"
        small = chat_body(route, {"type": "object", "properties": {"x": {"enum": [1, 2]}}})
        assert httpx.post(served.url + route, json=small, timeout=60).status_code == 200


@pytest.mark.parametrize("blocks", [200_000, 400_000])
def test_text_blocks_are_joined_once_and_counted_before_they_are(chat_tokenizer, blocks):
    """``/v1/messages`` joined a user turn's text blocks one by one (quadratic: 200,000 blocks froze the
    loop for 1.7 s, 480,000 for 24 s) before any size check; now they are joined once, and a body of more
    JSON values than the endpoint's budget is refused before it is parsed."""
    with ServedEngine(RecordingEngine(chat_tokenizer)) as served:
        content = ",".join(f'{{"type":"text","text":"w{i % 30} "}}' for i in range(blocks))
        body = f'{{"max_tokens":1,"messages":[{{"role":"user","content":[{content}]}}]}}'.encode()
        with LoopWatch(served.run(running_loop())) as watch:
            answer = httpx.post(served.url + "/v1/messages", content=body, timeout=120)
        limit = stall_limit(body)
        assert watch.worst < limit, f"the loop stalled {watch.worst:.2f}s (limit {limit:.2f}s)"
        if blocks == 200_000:
            assert answer.status_code == 200, answer.text[:300]
        else:
            assert answer.status_code == 413 and "JSON values" in answer.text, answer.text[:300]
            assert served.engine.requests == 0


async def running_loop():
    return asyncio.get_running_loop()


def write_rows(path, texts):
    path.write_text("".join(json.dumps({"input": t, "label": "1"}) + "\n" for t in texts))
    return str(path)


def test_an_oversized_data_row_is_a_bad_row_before_tokenizing(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", ["1 + 0 = ?", "x" * (1 << 20) + "y", "2 + 0 = ?"])
    tokenizer = CountingTokenizer()
    args = RolloutConfig.from_dict({"prompt_data": data, "on_bad_row": "skip"})
    source = DataSource(args, tokenizer=tokenizer)
    assert len(source.prompts) == 2 and source.metrics()["bad_rows_skipped"] == 1
    assert tokenizer.longest < 100
    with pytest.raises(DataError, match=r"line 2: the prompt has more than 1,048,576 characters") as error:
        DataSource(RolloutConfig.from_dict({"prompt_data": data}), tokenizer=CountingTokenizer())
    assert len(str(error.value)) < 500  # named, not dumped


def test_the_prompt_limit_bounds_the_characters_too(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", ["short", "z" * 300])
    tokenizer = CountingTokenizer()
    args = RolloutConfig.from_dict({"prompt_data": data, "on_bad_row": "skip", "rollout_max_prompt_len": 8})
    source = DataSource(args, tokenizer=tokenizer)
    assert [p.prompt for p in source.prompts] == ["short"] and tokenizer.longest == 5


def test_a_folder_given_as_the_data_file_is_named_as_one(tmp_path):
    with pytest.raises(DataError, match="is a folder, not a data file"):
        DataSource(RolloutConfig.from_dict({"prompt_data": str(tmp_path)}))
