"""Reading data: JSONL and Parquet, row slices, keys, bad rows and empty datasets."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlsdk import RolloutConfig
from rlsdk.data import DataPath, DataSource
from rlsdk.errors import DataError
from rlsdk.run.job import check_data


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def source(pm, path, **options):
    return DataSource(RolloutConfig(**options), pm=pm, path=path)


def prompts(ds):
    return [group[0].prompt for group in ds.iter_groups()]


def test_data_path_parses_slices():
    assert DataPath.parse("d/x.jsonl") == DataPath(__import__("pathlib").Path("d/x.jsonl"))
    parsed = DataPath.parse("d/x@y.jsonl@[2:-1]")
    assert (str(parsed.path), parsed.start, parsed.end) == ("d/x@y.jsonl", 2, -1)
    assert (DataPath.parse("x.jsonl@[:3]").start, DataPath.parse("x.jsonl@[:3]").end) == (None, 3)
    assert str(DataPath.parse("x.jsonl@[5:]")) == "x.jsonl@[5:]"


def test_jsonl_keys_and_slices(pm, tmp_path):
    rows = [
        {"question": f"q{i}", "answer": str(i), "meta": {"id": i}, "tools": [{"name": "t"}]} for i in range(6)
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows[:3] + [""] + rows[3:])  # a blank line is not a row
    ds = source(pm, f"{path}@[1:-1]", input_key="question", label_key="answer", metadata_key="meta")
    assert prompts(ds) == ["q1", "q2", "q3", "q4"]
    first = next(ds.iter_groups())[0]
    assert (first.label, first.metadata) == ("1", {"id": 1, "tools": [{"name": "t"}]})
    assert source(pm, f"{path}@[4:]", input_key="question").metrics()["rows_read"] == 2
    plain = source(pm, path, input_key="question")
    assert plain.prompts[0].label is None and plain.prompts[0].metadata == {"tools": [{"name": "t"}]}


def test_parquet_with_json_text_metadata_and_slices(pm, tmp_path):
    table = pa.table(
        {
            "input": ["a", "b", "c", "d"],
            "label": ["1", "2", "3", "4"],
            "metadata": [json.dumps({"k": i}) for i in range(4)],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    ds = source(pm, f"{tmp_path / 'd.parquet'}@[1:3]", label_key="label")
    assert prompts(ds) == ["b", "c"]
    assert [(p.label, p.metadata, p.where.rsplit(":", 1)[1]) for p in ds.prompts] == [
        ("2", {"k": 1}, "row 2"),
        ("3", {"k": 2}, "row 3"),
    ]


def test_parquet_row_missing_input_names_the_row(pm, tmp_path):
    pq.write_table(pa.table({"input": ["a", None, "c"]}), tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"d\.parquet:row 2: no input key 'input'"):
        source(pm, tmp_path / "d.parquet")
    assert source(pm, tmp_path / "d.parquet", on_bad_row="skip").metrics()["bad_rows_skipped"] == 1


BAD_ROWS = [
    ('{"input": "ok"}', None),
    ('{"input": "broken"', "malformed JSON"),
    ('["input"]', "expected a JSON object"),
    ('{"prompt": "wrong key"}', "no input key 'input'"),
    ('{"input": 7}', "input 'input' must be a string or a list of chat messages"),
    ('{"input": [{"content": "no role"}]}', "input 'input' must be a string or a list of chat messages"),
    ('{"input": "x", "metadata": [1]}', "'metadata' must be an object"),
    ('{"input": "x", "tools": "not json"}', "'tools' must be a list"),
]


@pytest.mark.parametrize("line,problem", [b for b in BAD_ROWS if b[1]])
def test_bad_row_is_an_error_naming_file_and_line(pm, tmp_path, line, problem):
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"input": "fine"}', "", line])
    with pytest.raises(DataError) as info:
        source(pm, path)
    assert f"{path}:line 3: {problem}" in str(info.value)
    assert "on_bad_row: skip" in str(info.value)


def test_one_bad_utf8_byte_is_one_bad_row(pm, tmp_path):
    """A byte that is not UTF-8 used to reject the whole file, even with on_bad_row: skip."""
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"input": "first"}\n{"input": "caf\xe9"}\n{"input": "l\xc3\xa9 last"}\n')
    ds = source(pm, path, on_bad_row="skip")
    assert prompts(ds) == ["first", "l\u00e9 last"] and ds.metrics()["bad_rows_skipped"] == 1
    with pytest.raises(DataError, match=f"{path}:line 2: not UTF-8 text"):
        source(pm, path)


def test_bad_rows_are_skipped_and_counted(pm, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [line for line, _ in BAD_ROWS] + ['{"input": "last"}'])
    ds = source(pm, path, on_bad_row="skip")
    assert prompts(ds) == ["ok", "last"]
    metrics = ds.metrics()
    assert (metrics["rows_read"], metrics["bad_rows_skipped"], metrics["prompts"]) == (9, 7, 2)


def test_bad_rows_outside_the_slice_are_not_read(pm, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ['{"input": "a"}', "{oops", '{"input": "c"}'])
    assert prompts(source(pm, f"{path}@[2:]")) == ["c"]


@pytest.mark.parametrize("content,spec", [("", ""), ("\n\n", ""), ('{"input": "a"}\n', "@[1:]")])
def test_empty_dataset_is_an_error(pm, tmp_path, content, spec):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match="no usable prompts"):
        source(pm, f"{path}{spec}")


def test_all_rows_skipped_is_an_error_with_counts(pm, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["{bad", '{"x": 1}'])
    with pytest.raises(DataError, match="2 rows read, 2 bad rows skipped"):
        source(pm, path, on_bad_row="skip")


def test_missing_file_unknown_format_and_no_path(pm, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        source(pm, tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("input\na\n")
    with pytest.raises(DataError, match=r"unknown data format '\.csv'; use one of \.jsonl, \.parquet"):
        source(pm, tmp_path / "d.csv")
    with pytest.raises(DataError, match="set prompt_data"):  # a run needs data (a bare DataSource is slime's empty one)
        check_data(RolloutConfig())
    with pytest.raises(ValueError, match="on_bad_row"):
        RolloutConfig(on_bad_row="ignore")


def test_messages_without_chat_template_say_how_to_fix(pm, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"input": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match="--apply-chat-template"):
        source(pm, path, on_bad_row="skip")  # a configuration error, not a bad row


def test_template_and_length_options_need_a_tokenizer(pm, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "a"}])
    with pytest.raises(DataError, match="needs a tokenizer"):
        source(pm, path, apply_chat_template=True)
    with pytest.raises(DataError, match="needs a tokenizer"):
        source(pm, path, rollout_max_prompt_len=10)


def test_dataset_shipped_inside_a_package(pm, tmp_path, monkeypatch):
    import importlib.resources

    package = tmp_path / "shipped_data_pkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    write_jsonl(package / "data" / "arith.jsonl", [{"input": "1 + 1 = ?", "label": "2"}])
    monkeypatch.syspath_prepend(str(tmp_path))
    resource = importlib.resources.files("shipped_data_pkg") / "data" / "arith.jsonl"
    with importlib.resources.as_file(resource) as real_path:
        ds = source(pm, str(real_path), label_key="label")
    assert [(g[0].prompt, g[0].label) for g in ds.iter_groups()] == [("1 + 1 = ?", "2")]
