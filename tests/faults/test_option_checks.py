"""Options checked at start (X2): a NaN temperature used to be accepted and fail at step 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlsdk import RolloutConfig

from .conftest import RLSDK


@pytest.mark.parametrize(
    "option", [{"rollout_temperature": float("nan")}, {"rollout_top_p": float("inf")}, {"lr": float("nan")}]
)
def test_a_non_finite_sampling_option_is_refused_at_start(option):
    [name] = option
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        RolloutConfig(**option)


def test_rlsdk_run_refuses_a_nan_temperature_before_loading_anything(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rlsdk_cli.app import main; main()",
            "run",
            "--temperature",
            "nan",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "rollout_temperature must be a finite number" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["nan", "inf", "Infinity"])
def test_a_reward_function_named_like_a_non_finite_number_is_a_path_not_a_rubric_weight(tmp_path, name):
    """``--rm reward.py:nan`` used to be read as a rubric of ``reward.py`` weighted NaN (an error), so a
    function of that name could not be named: a rubric weight is a decimal number only."""
    reward = tmp_path / "reward.py"
    reward.write_text(f"def {name}(args, sample, **kw):\n    return 0.25\n")
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"response": "r", "label": "l"}\n')
    done = subprocess.run(
        [*RLSDK, "score", "--rm", f"{reward}:{name}", "-i", str(src), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(out.read_text())["reward"] == 0.25
