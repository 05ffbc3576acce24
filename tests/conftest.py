"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "plugins(*packages): the test needs these plugin packages (rlsdk_rm_hub, ...) installed; skipped "
        "without them, so core's tests pass with no plugin package",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("plugins"):
        missing = [package for package in mark.args if importlib.util.find_spec(package) is None]
        if missing:
            pytest.skip(f"needs the plugin packages {', '.join(missing)}")


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a plugin distribution as a real ``.dist-info`` folder plus module on ``sys.path``.

    ``fake_dist(dist, version, entry_point, module, source)`` writes ``module.py`` with ``source`` and an
    ``rlsdk`` entry point ``entry_point = module``, exactly what pip would leave behind.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(dist: str, version: str, entry_point: str, module: str, source: str) -> Path:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[rlsdk]\n{entry_point} = {module}\n")
        created.append(module)
        importlib.invalidate_caches()
        return site

    yield make
    for module in created:
        sys.modules.pop(module, None)


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An 'interpreter' whose ``-m sglang.launch_server`` is ``fake_sglang_interpreter.py`` (SGLang needs
    CUDA): pass it as ``sglang_python``."""
    fake = Path(__file__).with_name("fake_sglang_interpreter.py")
    script = tmp_path / "fake-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def pm(rlsdk_pm):
    """A fresh plugin manager with filter_hub registered where it is installed (pop_last and drop_stale
    beside core's pop_first; tests of those are marked ``plugins("rlsdk_filter_hub")``)."""
    if importlib.util.find_spec("rlsdk_filter_hub") is not None:
        rlsdk_pm.register(importlib.import_module("rlsdk_filter_hub.plugin"))
    return rlsdk_pm


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with hidden size 32 and random weights over a 32-word vocabulary (a word-level
    tokenizer built here), so that a quarter of first tokens earn the test reward from the start."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    words = ["<eos>", "<pad>", *[f"w{i}" for i in range(30)]]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>").save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=1)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
