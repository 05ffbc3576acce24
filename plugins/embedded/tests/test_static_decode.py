"""The running batch: static decode steps (fixed buffers, a 4D mask over every column; CUDA graphs on CUDA)
against eager steps, on the real small model on CPU and captured as CUDA graphs where a GPU is present;
prompts shared by several rows prefilled once."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def greedy_run(batch, steps_between: list[int], first_prompt: list[int]) -> list[torch.Tensor]:
    """Prefill two rows, then in turn: decode, merge a third row, decode past the buffers' free columns
    (a refill), keep two rows in a new order, decode. Feeds greedy tokens; returns every step's logits."""
    seen = []

    def feed(logits, first=0):
        seen.append(logits.clone())
        batch.set_tokens(logits.argmax(-1), first)

    with torch.inference_mode():
        feed(batch.prefill([first_prompt, [7, 8]]))
        for n, change in zip(steps_between, ("join", "keep", None)):
            for _ in range(n):
                feed(batch.decode())
            if change == "join":
                first = batch.size
                feed(batch.prefill([[9, 10, 11]]), first)
            elif change == "keep":
                batch.keep([2, 0])
    return seen


def tiny_llama(hidden: int, layers: int, heads: int, kv_heads: int, vocab: int):
    """A random Llama with the engine's attention: for what only needs some full-attention model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlsdk_embedded import attention

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        attn_implementation=attention.register(),
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM

    from rlsdk_embedded import attention
    from rlsdk_embedded.model_files import resolve_model_path

    return AutoModelForCausalLM.from_pretrained(
        resolve_model_path(None, None), dtype=torch.float32, attn_implementation=attention.register()
    ).eval()


def test_static_steps_give_the_eager_steps_logits(smollm2, monkeypatch):
    """Through a merge, a refill and a select, static steps' logits equal eager ones; and static steps
    did run (all but a few eager steps on each new set of buffers). A small slack and a 40-token prompt
    make the merged rows' buffers (64 columns) fill up within 25 steps."""
    from rlsdk_embedded import batch, static_decode

    monkeypatch.setattr(batch, "SLACK", 8)
    static_steps = []
    step = static_decode.StaticDecode.step
    monkeypatch.setattr(
        static_decode.StaticDecode, "step", lambda self, t: static_steps.append(1) or step(self, t)
    )
    refills = []  # new buffers for a decode step's incoming column
    fill = batch.SlackLayer._fill
    monkeypatch.setattr(
        batch.SlackLayer, "_fill", lambda self, parts, n: refills.append(n) or fill(self, parts, n)
    )
    plan, prompt = [3, 25, 10], list(range(1, 41))
    KVBatch = batch.KVBatch
    eager = greedy_run(KVBatch(smollm2, boolean_decode_mask=True), plan, prompt)
    assert any(refills)
    static = greedy_run(KVBatch(smollm2, boolean_decode_mask=True, static_decode=True), plan, prompt)
    assert len(static) == len(eager)
    for a, b in zip(eager, static):
        torch.testing.assert_close(b, a, atol=2e-4, rtol=0)
    assert len(static_steps) >= sum(plan) - 8


def test_rows_joining_every_few_steps_stop_setting_up_static_steps(monkeypatch):
    """A capture costs several steps, so buffers that change every three steps (a row joins) soon get
    eager steps only, and a batch that then keeps its buffers gets static steps again; the logits equal
    eager ones throughout. A random two-layer Llama: only the set-up policy is under test."""
    from rlsdk_embedded import static_decode
    from rlsdk_embedded.batch import KVBatch

    set_up = []
    init = static_decode.StaticDecode.__init__
    monkeypatch.setattr(
        static_decode.StaticDecode, "__init__", lambda self, *a, **k: set_up.append(1) or init(self, *a, **k)
    )
    model = tiny_llama(hidden=64, layers=2, heads=4, kv_heads=2, vocab=300)
    batches = (
        KVBatch(model, boolean_decode_mask=True),
        KVBatch(model, boolean_decode_mask=True, static_decode=True),
    )

    def run(steps: int, join: bool) -> None:
        with torch.inference_mode():
            for _ in range(steps):
                eager, static = (batch.decode() for batch in batches)
                torch.testing.assert_close(static, eager, atol=1e-5, rtol=0)
                for batch in batches:
                    batch.set_tokens(eager.argmax(-1))
            if join:
                first = batches[0].size
                logits = [batch.prefill([[5, 6, 7]]) for batch in batches]
                for batch in batches:
                    batch.set_tokens(logits[0].argmax(-1), first)

    with torch.inference_mode():
        for batch in batches:
            batch.set_tokens(batch.prefill([[1, 2, 3, 4]]).argmax(-1))
    for _ in range(12):
        run(3, join=True)
    assert len(set_up) <= 3
    before = len(set_up)
    run(60, join=False)
    assert len(set_up) == before + 1 and batches[1]._static.steps > 40


def test_a_shared_prompt_runs_once_and_each_row_decodes_as_if_alone():
    """Four rows, three of them with one prompt: the model sees two prompts, and every row's logits, through
    prefill and five decode steps that feed each row other tokens, equal those of the row run alone. A random
    two-layer Llama: only the batch's bookkeeping is under test."""
    from rlsdk_embedded.batch import KVBatch

    model = tiny_llama(hidden=64, layers=2, heads=4, kv_heads=2, vocab=300)
    prompts = [[1, 2, 3, 4], [1, 2, 3, 4], [7, 8], [1, 2, 3, 4]]
    seen_rows = []
    forward = model.forward
    model.forward = lambda *a, **k: seen_rows.append(k["input_ids"].shape[0]) or forward(*a, **k)

    def tokens(step: int, row: int) -> int:
        return 10 + 7 * row + step

    with torch.inference_mode():
        shared = KVBatch(model)
        logits = [shared.prefill(prompts)]
        for step in range(5):
            shared.set_tokens(torch.tensor([tokens(step, r) for r in range(len(prompts))]))
            logits.append(shared.decode())
        assert seen_rows[0] == 2
        for row, prompt in enumerate(prompts):
            alone = KVBatch(model)
            expected = [alone.prefill([prompt])]
            for step in range(5):
                alone.set_tokens(torch.tensor([tokens(step, row)]))
                expected.append(alone.decode())
            for got, want in zip(logits, expected, strict=True):
                torch.testing.assert_close(got[row : row + 1], want, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA card")
def test_cuda_graph_steps_give_the_eager_steps_logits():
    """On CUDA static steps are replayed from captured graphs; float32, a random two-layer Llama (no
    download: the real small model's package may be missing on a GPU machine)."""
    from rlsdk_embedded.batch import SLACK, KVBatch

    model = tiny_llama(hidden=256, layers=2, heads=8, kv_heads=4, vocab=1000).cuda()
    plan = [5, SLACK + 20, 30]
    eager = greedy_run(KVBatch(model, boolean_decode_mask=True), plan, [1, 2, 3, 4, 5])
    graphed = KVBatch(model, boolean_decode_mask=True, static_decode=True)
    static = greedy_run(graphed, plan, [1, 2, 3, 4, 5])
    for a, b in zip(eager, static):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    assert graphed._static is not None and graphed._static.graph is not None
