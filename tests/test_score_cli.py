"""``rlsdk score`` on JSONL files, with the installed rm_hub and a dotted-path reward."""

import json

import pytest
from typer.testing import CliRunner

from rlsdk_cli.app import app


def write(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.plugins('rlsdk_rm_hub')
def test_score_math_with_malformed_lines(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"response": "6 + 5 = 11", "label": "11", "id": 1}, "not json",
                {"answer": "x", "gold": "1"}, {"response": "\\boxed{3}", "label": "4", "metadata": {"rm_type": "f1"}}])
    result = CliRunner().invoke(app, ["score", "--rm", "math", "-i", str(src), "-o", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    rows = read(out)
    assert [r["reward"] for r in rows] == [1.0, 0.0] and rows[0]["id"] == 1
    assert "in.jsonl:2" in result.output and "in.jsonl:3" in result.output
    assert "scored 2 lines" in result.output and "malformed 2" in result.output


@pytest.mark.plugins('rlsdk_rm_hub')
def test_score_stop_on_error_and_field_names(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"answer": "Paris", "gold": "paris"}, "{", {"answer": "x", "gold": "y"}])
    result = CliRunner().invoke(app, ["score", "--rm", "f1", "-i", str(src), "-o", str(out), "--response-key",
                                      "answer", "--label-key", "gold", "--on-error", "stop"])
    assert result.exit_code == 1
    assert [r["reward"] for r in read(out)] == [1.0]


def test_score_dotted_path_invalid_and_dict(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    (tmp_path / "my_rm.py").write_text(
        "def rm(args, sample, **kw):\n    if sample.label == 'boom':\n        raise RuntimeError('no')\n"
        "    return {'score': 2.0}\n")
    write(src, [{"response": "a", "label": "ok"}, {"response": "a", "label": "boom"}])
    result = CliRunner().invoke(app, ["score", "--rm", f"{tmp_path / 'my_rm.py'}:rm", "-i", str(src),
                                      "-o", str(out), "--reward-key", "score"])
    assert result.exit_code == 0, result.output
    rows = read(out)
    assert rows[0]["reward"] == {"score": 2.0}
    assert rows[1]["reward"] is None and "RuntimeError: no" in rows[1]["reward_error"]
    assert "mean 2.0" in result.output and "invalid 1" in result.output


def test_score_unknown_reward(tmp_path):
    src = tmp_path / "in.jsonl"
    write(src, [{"response": "a", "label": "a"}])
    result = CliRunner().invoke(app, ["score", "--rm", "nope", "-i", str(src), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "Choose one of" in result.output


@pytest.mark.plugins('rlsdk_rm_hub')
def test_score_through_the_grader_pool_ends_without_a_traceback(tmp_path):
    """The console script in a fresh process, with answers only the grader workers decide: a successful
    run prints its summary and nothing else (a BrokenPipeError from the pool once ended every run)."""
    import subprocess
    import sys
    from pathlib import Path

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"response": "\\boxed{\\frac{1}{2}}", "label": "0.5"},
                {"response": "\\boxed{x^2+2x+1}", "label": "(x+1)^2"},
                {"response": "\\boxed{\\sqrt{8}}", "label": "2\\sqrt{2}"}])
    exe = Path(sys.executable).with_name("rlsdk")
    done = subprocess.run([str(exe), "score", "--rm", "math", "-i", str(src), "-o", str(out), "--workers", "2"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and [r["reward"] for r in read(out)] == [1.0, 1.0, 1.0]
    assert done.stdout.startswith("scored 3 lines") and done.stderr == ""
