"""Chat messages with images: kept by the data source in ``sample.multimodal_inputs`` and sent to the
engine as SGLang's ``text`` plus ``image_data``. The request shape is checked on
``rlsdk.testing.FakeEngine`` (a stand-in engine that records payloads); the real engine's answer
is in plugins/generators/tests/test_multimodal.py."""

from __future__ import annotations

import json

import pytest

from rlsdk import RolloutConfig, Sample
from rlsdk.data import DataSource
from rlsdk.errors import DataError
from rlsdk.rollout.generate import generate, sampling_params_for
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import FakeEngine, FakeReply

DATA_URI = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
RAW_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def rows(folder):
    (folder / "cat.png").write_bytes(b"\x89PNG not really")
    return [
        {"input": [{"role": "user", "content": [{"type": "text", "text": "What animal is this?"},
                                                {"type": "image", "image": "cat.png"}]}], "label": "cat"},
        {"input": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/dog.jpg"}},
                                                {"type": "image_url", "image_url": {"url": DATA_URI}},
                                                {"type": "image", "image": RAW_BASE64},
                                                {"type": "text", "text": "Compare them."}]}], "label": "x"},
        {"input": "No picture here.", "label": "y"},
    ]


def source(pm, tmp_path, tokenizer, data, **options):
    path = tmp_path / "images.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    args = RolloutConfig(prompt_data=str(path), label_key="label", apply_chat_template=True, n_samples_per_prompt=1,
                         **options)
    return args, DataSource(args, pm=pm, tokenizer=tokenizer)


def test_data_source_keeps_paths_urls_and_base64(rlsdk_pm, small_tokenizer, tmp_path):
    args, data = source(rlsdk_pm, tmp_path, small_tokenizer, rows(tmp_path))
    cat, pair, plain = [group[0] for group in data.get_samples(3)]
    assert data.has_images
    assert cat.multimodal_inputs == {"images": [str((tmp_path / "cat.png").resolve())]}
    assert pair.multimodal_inputs == {"images": ["https://example.com/dog.jpg", DATA_URI, RAW_BASE64]}
    assert plain.multimodal_inputs is None
    # SmolLM2's template takes string contents only: the text parts are rendered, the images stay apart
    assert cat.prompt == small_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What animal is this?"}], tokenize=False, add_generation_prompt=True)
    assert cat.tokens == small_tokenizer(cat.prompt, add_special_tokens=False)["input_ids"]
    restored = Sample.from_dict(json.loads(json.dumps(pair.to_dict())))
    assert restored.multimodal_inputs == pair.multimodal_inputs


def test_malformed_image_part_names_the_row(rlsdk_pm, small_tokenizer, tmp_path):
    bad = [{"input": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}]
    with pytest.raises(DataError, match=r"images.jsonl:line 1: a 'image_url' content part needs a path, URL or base64"):
        source(rlsdk_pm, tmp_path, small_tokenizer, bad)


def test_generate_sends_text_and_image_data(rlsdk_pm, small_tokenizer, tmp_path):
    args, data = source(rlsdk_pm, tmp_path, small_tokenizer, rows(tmp_path), rollout_max_response_len=32)
    cat, pair, plain = [group[0] for group in data.get_samples(3)]
    engine = FakeEngine([FakeReply("A small", abort=True), " cat.<|im_end|>", "Fine.<|im_end|>"], small_tokenizer)
    runtime = bind_runtime(args, Runtime(rlsdk_pm, engine, small_tokenizer))
    try:
        params = sampling_params_for(args)
        runtime.run(generate(args, cat, params))
        assert cat.status == Sample.Status.ABORTED
        runtime.run(generate(args, cat, params))  # the continuation carries the partial response as text
        runtime.run(generate(args, plain, params))
    finally:
        runtime.loop.close()
    first, second, third = engine.payloads
    images = [str((tmp_path / "cat.png").resolve())]
    assert first == {"text": cat.prompt, "image_data": images, "sampling_params": first["sampling_params"],
                     "return_logprob": True}
    assert second["text"] == cat.prompt + "A small" and second["image_data"] == images and "input_ids" not in second
    assert "image_data" not in third and third["input_ids"] == small_tokenizer(plain.prompt, add_special_tokens=False)["input_ids"]
    assert cat.status == Sample.Status.COMPLETED and cat.response == "A small cat."  # the stop token in the ids, not the text
    assert len(cat.loss_mask) == len(cat.rollout_log_probs) == cat.response_length


def test_multimodal_keys_put_a_rows_images_at_its_placeholders(rlsdk_pm, small_tokenizer, tmp_path):
    """slime's ``--multimodal-keys '{"image": "images"}'`` (geo3k's data): the row's ``images`` column fills the
    prompt's ``<image>`` placeholders in order, each a path, URL, base64 or content part."""
    (tmp_path / "cat.png").write_bytes(b"\x89PNG not really")
    data = [
        {"input": "<image>Which is bigger, this<image> or that?", "images": ["cat.png", {"type": "image", "image": DATA_URI}],
         "label": "a"},
        {"input": "No picture here.", "label": "b"},
        {"input": "Two placeholders <image><image>", "images": ["cat.png"], "label": "c"},
        {"input": "<image>", "images": ["cat.png"], "video": ["v.mp4"], "label": "d"},
    ]
    args, source_ = source(rlsdk_pm, tmp_path, small_tokenizer, data[:2], multimodal_keys={"image": "images"})
    pair, plain = [group[0] for group in source_.get_samples(2)]
    assert pair.multimodal_inputs == {"images": [str((tmp_path / "cat.png").resolve()), DATA_URI]}
    assert plain.multimodal_inputs is None and plain.prompt.endswith("assistant\n")
    assert pair.prompt == small_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which is bigger, this or that?"}], tokenize=False, add_generation_prompt=True)
    with pytest.raises(DataError, match=r"images\.jsonl:line 1: more <image> placeholders than the 1 image"):
        source(rlsdk_pm, tmp_path, small_tokenizer, data[2:3], multimodal_keys={"image": "images"})
    with pytest.raises(DataError, match=r"take images only; this row has \['video'\]"):
        source(rlsdk_pm, tmp_path, small_tokenizer, data[3:], multimodal_keys={"image": "images", "video": "video"})


def test_multimodal_keys_take_hugging_face_image_columns():
    """A Parquet image column as Hugging Face datasets write it (``{"bytes", "path"}``) gives base64 images."""
    from rlsdk.data.images import with_media

    messages = with_media("Look: <image>", {"images": [{"bytes": b"\x89PNG", "path": None}]}, {"image": "images"})
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "Look: "},
                                                     {"type": "image", "image": "iVBORw=="}]}]
