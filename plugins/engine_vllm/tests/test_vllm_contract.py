"""The engine contract (:data:`rlsdk.testing.ENGINE_CONTRACT`, which the SGLang client keeps in core's
``tests/test_engine_contract.py``) held against the vllm engine: its client over real HTTP on loopback, with an
API key, in front of vLLM 0.26's routes restated from its source (:mod:`rlsdk_engine_vllm.stand_in`; vLLM
needs CUDA) serving the embedded engine on the tiny Llama. The stand-in takes CUDA-IPC updates of CPU tensors
and sleeps and wakes, so the colocated checks run here too."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsdk.testing import ENGINE_CONTRACT, EngineKit, check_engine_contract
from rlsdk_engine_vllm.client import VLLMClient
from rlsdk_engine_vllm.stand_in import ServedVLLM

REFUSED = {
    "retract": "vLLM 0.26 cannot pause with mode 'retract'",
    "image": "key 'image_data' has no vLLM 0.26 equivalent",
    "n": r"sampling parameter 'n' has no vLLM 0.26 equivalent here \(n > 1",
}


@pytest.fixture
def served(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch):
    from rlsdk_embedded.engine import EmbeddedEngine

    monkeypatch.setenv("VLLM_API_KEY", "contract-key")
    engine = EmbeddedEngine(str(tiny_llama), device="cpu", threads=1)
    with ServedVLLM(engine, str(tiny_llama), api_key="contract-key") as running:
        yield running


@pytest.mark.parametrize("name", list(ENGINE_CONTRACT))
def test_the_vllm_engine_keeps_the_engine_contract(
    name: str, served, tiny_llama: Path, tmp_path: Path
) -> None:
    kit = EngineKit.for_model(tiny_llama, tmp_path, serves={"tensor", "release"}, rejects=dict(REFUSED))
    if reason := check_engine_contract(name, lambda: VLLMClient(served.url), kit):
        pytest.skip(reason)
    assert not served.state.dead
