"""A module-scoped ``rlsdk serve`` of the real small model (SmolLM2-135M-Instruct, CPU, float32)."""

from __future__ import annotations

import pytest

from rlsdk.testing import ServedEngine


@pytest.fixture(scope="module", params=[False, True], ids=["eager", "static"])
def served(request):
    """Every test twice: eager decode steps (the CPU default), and static ones (the CUDA default, here
    run eagerly: the same buffers, masks and overlapped steps, without graph capture)."""
    from rlsdk_embedded import EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=32, static_decode=request.param)) as served:
        yield served
