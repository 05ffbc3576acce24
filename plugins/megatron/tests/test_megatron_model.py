"""The converted megatron-core ``GPTModel`` computes transformers' function: same per-token log-probs in
float32 on a tiny GQA Llama (tied embeddings, rope base 500000) saved by ``save_pretrained`` and read back
as the trainer reads it (transformers 5 writes the rope base under ``rope_parameters``; read from the top
level it fell back to 10000, issue 23), and its state dict converts back to the Hugging Face weights.

Runs on CPU where megatron-core (and the triton it imports) can be imported; megatron-core ships cp312
wheels only, so elsewhere the module is skipped. megatron-core 0.19 assumes CUDA in three places a
float32, dropout-free forward does not need, which the ``cpu_megatron`` fixture points at the CPU: the
rotary frequencies are moved to ``torch.cuda.current_device()``, the default causal mask is allocated on
``"cuda"``, and attention dropout forks the CUDA RNG tracker (cpu_megatron.py). Everything else is
megatron's real code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (cp312 wheels only)")

from rlsdk import load_callable  # noqa: E402
from rlsdk_megatron.convert import megatron_to_hf  # noqa: E402
from rlsdk_megatron.trainer import build_gpt_model, packed_logits, read_hf_weights, response_logits  # noqa: E402

patch_for_cpu = load_callable(f"{Path(__file__).with_name('cpu_megatron.py')}:patch_for_cpu")

TINY = load_callable(f"{Path(__file__).with_name('cpu_megatron.py')}:tiny_llama")(
    num_hidden_layers=3, vocab_size=128, tie_word_embeddings=True
)


@pytest.fixture(scope="module")
def cpu_megatron():
    import torch.distributed as dist
    from megatron.core import parallel_state

    from rlsdk.trainer_api import free_port

    patches = pytest.MonkeyPatch()
    patch_for_cpu(patches.setattr)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    patches.undo()


@pytest.fixture(scope="module")
def models(cpu_megatron, tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY)).save_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    config = json.loads((folder / "config.json").read_text())
    megatron = build_gpt_model(config, read_hf_weights(folder), torch.float32, torch.device("cpu"))
    return hf, megatron.eval(), config


def test_per_token_log_probs_equal_transformers(models):
    """Rows of different lengths (right-padded together) in slime's packed layout, batch size != length."""
    hf, megatron, _ = models
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, TINY["vocab_size"], (n,), generator=generator) for n in (17, 9, 12)]
    with torch.no_grad():
        packed = packed_logits(megatron, rows, pad_id=0, device=torch.device("cpu"))[0]
        separate = torch.cat([hf(input_ids=row[None]).logits[0] for row in rows])
    assert packed.shape == separate.shape
    gap = (packed.log_softmax(-1) - separate.log_softmax(-1)).abs()
    assert gap.max() < 1e-4, f"max |megatron - transformers| log-prob {gap.max():.3g} nats"
    # Not a vacuous comparison: the log-probs spread over several nats.
    assert separate.log_softmax(-1).std() > 1.0


def test_response_logits_are_the_packed_logits_response_rows(models):
    """The output layer given only the response positions' hidden states (rows of different lengths,
    responses of different lengths) returns the packed logits' rows that predict the responses."""
    _, megatron, _ = models
    generator = torch.Generator().manual_seed(2)
    rows = [torch.randint(0, TINY["vocab_size"], (n,), generator=generator) for n in (17, 9, 12)]
    lengths = [5, 1, 8]
    cpu = torch.device("cpu")
    with torch.no_grad():
        packed = packed_logits(megatron, rows, pad_id=0, device=cpu)[0]
        responses = response_logits(megatron, rows, lengths, pad_id=0, device=cpu)
    assert responses.shape == (1, sum(lengths), TINY["vocab_size"])
    # the rows predicting each response: a sample of T tokens with R in its response, rows T - R - 1 .. T - 2
    starts = [sum(len(r) for r in rows[:i]) for i in range(len(rows))]
    wanted = packed[[s + len(r) - n - 1 + k for s, r, n in zip(starts, rows, lengths) for k in range(n)]]
    assert (responses[0] - wanted).abs().max() < 1e-5
    assert not megatron.output_layer._forward_pre_hooks  # the hook is gone after the pass


def test_megatron_state_dict_converts_back_to_the_hugging_face_weights(models):
    hf, megatron, config = models
    back = megatron_to_hf(megatron.state_dict(), config)
    original = hf.state_dict()
    assert back.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name


QWEN3 = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,  # Qwen3's heads are wider than hidden / heads
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "rope_theta": 1000000.0,
    "initializer_range": 0.2,
}
MOE = {"moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("qwen3", {}),
        ("qwen3_moe", {**MOE, "norm_topk_prob": True}),
        ("qwen3_moe", {**MOE, "norm_topk_prob": False}),
    ],
    ids=["qwen3", "qwen3-moe-normalised-top-k", "qwen3-moe"],
)
def test_qwen3_and_qwen3_moe_log_probs_equal_transformers(cpu_megatron, tmp_path, model_type, extra):
    """QK-norm (megatron's q/k_layernorm), the router (softmax, top-2, renormalised or not) and the experts
    (megatron's SequentialMLP and all-to-all dispatcher) compute transformers' Qwen3/Qwen3-MoE; the
    state dict converts back to the checkpoint save_pretrained wrote."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **QWEN3, **extra)).save_pretrained(
        tmp_path
    )
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    config = json.loads((tmp_path / "config.json").read_text())
    saved = read_hf_weights(tmp_path)
    megatron = build_gpt_model(config, saved, torch.float32, torch.device("cpu")).eval()
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, QWEN3["vocab_size"], (n,), generator=generator) for n in (17, 9)]
    with torch.no_grad():
        packed = packed_logits(megatron, rows, pad_id=0, device=torch.device("cpu"))[0]
        separate = torch.cat([hf(input_ids=row[None]).logits[0] for row in rows])
    gap = (packed.log_softmax(-1) - separate.log_softmax(-1)).abs()
    assert gap.max() < 1e-4, f"max |megatron - transformers| log-prob {gap.max():.3g} nats"
    assert separate.log_softmax(-1).std() > 1.0
    back = megatron_to_hf(megatron.state_dict(), config)
    assert back.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(back[name], tensor), name
