"""Options checked at start (X2): a NaN temperature used to be accepted and fail at step 0."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlsdk import RolloutConfig


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
