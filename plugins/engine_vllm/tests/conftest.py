"""The vLLM plugin's tests share a stand-in interpreter: ``fake_vllm_interpreter.py`` answers as vLLM's
would (vLLM needs CUDA and is not installed here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKE = Path(__file__).with_name("fake_vllm_interpreter.py")


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An executable that runs :data:`FAKE` as ``vllm_python`` would run vLLM."""
    script = tmp_path / "vllm-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    script.chmod(0o755)
    return str(script)
