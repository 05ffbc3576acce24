"""Sizes are checked before any chat template or tokenizer work (S10, D1), and a folder given as the data
file is named as one (D5). Real HTTP on loopback; the engine is :class:`rlsdk.testing.FakeEngine` (the
checks before generation are tested, not a model)."""

from __future__ import annotations

import json

import httpx
import pytest

from rlsdk import RolloutConfig
from rlsdk.data import DataSource
from rlsdk.errors import DataError
from rlsdk.testing import ByteTokenizer, ServedEngine

from .conftest import RecordingEngine


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
