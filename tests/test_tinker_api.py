"""``rlsdk tinker serve`` driven by the real ``tinker`` client (the pinned 0.38.0) over HTTP on loopback, with
the tiny Llama of conftest.py on the torch trainer and the embedded engine (CPU, float32): the numbers the
client gets back are checked against a plain forward pass of the same model."""

from __future__ import annotations

import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.plugins("rlsdk_embedded")

NAME = "test/tiny-llama"
KEY, OTHER_KEY = "tml-test-key-0123456789abcdef", "tml-other-key-0123456789abcdef"
PROMPT = [2, 3, 4, 5, 6, 7]


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory):
    from rlsdk_embedded.engine import EmbeddedEngine

    from rlsdk.tinker.server import ServerThread
    from rlsdk.tinker.service import TinkerService
    from rlsdk.tinker.training import Placement

    service = TinkerService(
        {NAME: tiny_llama},
        lambda folder: EmbeddedEngine(str(folder), device="cpu", threads=1),
        tmp_path_factory.mktemp("tinker-checkpoints"),
        Placement("cpu", "float32", 1),
    )
    # small chunks: a batch of five datums reaches the server as three requests
    with ServerThread(service, [KEY, OTHER_KEY], client_config={"fwdbwd_max_chunk_len": 2}) as url:
        yield url, service


@pytest.fixture
def client(server):
    service_client = tinker.ServiceClient(base_url=server[0], api_key=KEY)
    yield service_client
    service_client.close("success").result()


@pytest.fixture(scope="module")
def reference(tiny_llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def target_logprobs(model, tokens: list[int], targets: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(targets)[:, None])[:, 0].tolist()


def datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    """Next-token datum over ``tokens``: inputs all but the last, targets all but the first."""
    inputs = {"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


BATCH = [datum([2 + i, 5, 9, 12 + i, 3, 0], [0.0, 0.0, 1.0, 1.0, -0.5]) for i in range(5)]
ADAM = types.AdamParams(learning_rate=5e-2, beta1=0.9, beta2=0.95, eps=1e-8)


def logprobs_of(result: types.ForwardBackwardOutput) -> list[list[float]]:
    return [out["logprobs"].tolist() for out in result.loss_fn_outputs]


def test_cross_entropy_is_a_weighted_sum_of_the_learner_logprobs_and_training_lowers_it(client, reference):
    trainer = client.create_lora_training_client(base_model=NAME, rank=4, seed=0).result()
    first = trainer.forward(BATCH, "cross_entropy").result()
    expected = [
        target_logprobs(reference, d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].tolist())
        for d in BATCH
    ]
    # a fresh adapter (B = 0) computes the base model's function
    assert np.allclose(np.concatenate(logprobs_of(first)), np.concatenate(expected), atol=1e-5)
    weighted = -sum(np.dot(lp, d.loss_fn_inputs["weights"].tolist()) for lp, d in zip(expected, BATCH))
    assert first.metrics["loss:sum"] == pytest.approx(weighted, rel=1e-5)
    losses = []
    for _ in range(5):
        step = trainer.forward_backward(BATCH, "cross_entropy")
        trainer.optim_step(ADAM).result()
        losses.append(step.result().metrics["loss:sum"])
    assert losses[-1] < losses[0] - 0.5, losses


def test_gradients_add_up_over_the_chunks_of_a_batch_and_over_calls(client):
    """One forward_backward of five datums (sent as three chunks) and two of two and three give one step."""
    whole = client.create_lora_training_client(base_model=NAME, rank=4, seed=1).result()
    parts = client.create_lora_training_client(base_model=NAME, rank=4, seed=1).result()
    whole.forward_backward(BATCH, "cross_entropy")
    parts.forward_backward(BATCH[:2], "cross_entropy")
    parts.forward_backward(BATCH[2:], "cross_entropy")
    norms = [whole.optim_step(ADAM).result().metrics, parts.optim_step(ADAM).result().metrics]
    assert norms[0]["grad_norm:mean"] == pytest.approx(norms[1]["grad_norm:mean"], rel=1e-5)
    after = [logprobs_of(c.forward(BATCH, "cross_entropy").result()) for c in (whole, parts)]
    assert np.allclose(np.concatenate(after[0]), np.concatenate(after[1]), atol=1e-5)


def rl_datum(tokens: list[int], sampled: list[float], advantages: list[float]) -> types.Datum:
    inputs = {"target_tokens": tokens[1:], "logprobs": sampled, "advantages": advantages}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("importance_sampling", None),
        ("ppo", None),
        ("cispo", {"clip_high_threshold": 1.1}),
        ("dro", {"beta": 0.5}),
    ],
)
def test_rl_losses_are_tinkers_sums_over_tokens(client, reference, loss_fn, config):
    from rlsdk.tinker.losses import LOSSES

    trainer = client.create_lora_training_client(base_model=NAME, rank=4, seed=2).result()
    tokens = [2, 8, 9, 10, 11, 0]
    learner = target_logprobs(reference, tokens[:-1], tokens[1:])
    sampled = [
        lp + d for lp, d in zip(learner, [0.3, -0.4, 0.05, 0.0, -0.2])
    ]  # ratios inside and outside the clip
    advantages = [0.0, 1.0, -1.0, 2.0, 0.5]
    result = trainer.forward([rl_datum(tokens, sampled, advantages)], loss_fn, config).result()
    assert np.allclose(logprobs_of(result)[0], learner, atol=1e-5)
    full_config = {**{k: v for k, v in LOSSES[loss_fn].config.items() if v is not None}, **(config or {})}
    inputs = {"logprobs": torch.tensor(sampled), "advantages": torch.tensor(advantages)}
    expected = LOSSES[loss_fn].fn(torch.tensor(learner), inputs, full_config)
    assert result.metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-4)


def test_the_loss_functions_match_their_definitions_and_gradients():
    """Tinker's documented formulas, token by token; PPO passes no gradient where the ratio is clipped and the
    advantage pushes it further, CISPO's clipped ratio is a constant."""
    from rlsdk.tinker.losses import LOSSES

    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    q = torch.tensor([-1.5, -1.0, -0.5])  # ratios e^0.5 (clipped high), e^-1 (clipped low), 1
    adv = torch.tensor([1.0, -1.0, 2.0])
    inputs = {"logprobs": q, "advantages": adv, "weights": torch.tensor([1.0, -2.0, 0.0])}
    clip = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    ratio = torch.exp(lp.detach() - q)
    cases = {
        "cross_entropy": ({}, -(-1.0 * 1.0 + -2.0 * -2.0), [-1.0, 2.0, 0.0]),
        "importance_sampling": ({}, -(ratio * adv).sum().item(), (-(ratio * adv)).tolist()),
        "ppo": (clip, -(1.2 * 1.0 + 0.8 * -1.0 + 1.0 * 2.0), [0.0, 0.0, -2.0]),
        "cispo": (clip, -(1.2 * -1.0 * 1.0 + 0.8 * -2.0 * -1.0 + 1.0 * -0.5 * 2.0), [-1.2, 0.8, -2.0]),
        "dro": ({"beta": 0.5}, -((lp.detach() * adv) - 0.25 * (lp.detach() - q) ** 2).sum().item(), None),
    }
    for name, (config, value, gradient) in cases.items():
        lp.grad = None
        loss = LOSSES[name].fn(lp, inputs, config)
        loss.backward()
        assert loss.item() == pytest.approx(value, rel=1e-6), name
        if gradient is not None:
            assert lp.grad.tolist() == pytest.approx(gradient, rel=1e-6), name
    expected = -(adv - 0.5 * (lp.detach() - q))  # d/dlp of -(lp*A - beta/2 (lp-q)^2) with beta 0.5
    assert lp.grad.tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_forward_backward_custom_trains_like_the_cross_entropy_it_reduces_to(client):
    """A custom loss runs in the client on the learner's log-probs; the server's backward is cross-entropy with
    the loss's gradient as weights, so a loss of -sum(2 * logprobs * w) equals cross-entropy with 2w."""
    custom = client.create_lora_training_client(base_model=NAME, rank=4, seed=3).result()
    plain = client.create_lora_training_client(base_model=NAME, rank=4, seed=3).result()

    def doubled(data, logprobs_list):
        loss = sum(
            -(2 * lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs_list)
        )
        return loss, {"doubled:sum": float(loss)}

    result = custom.forward_backward_custom(BATCH, doubled).result()
    twice = [datum_with_weights(d, 2.0) for d in BATCH]
    reference = plain.forward_backward(twice, "cross_entropy").result()
    assert result.metrics["loss:sum"] == pytest.approx(reference.metrics["loss:sum"], rel=1e-5)
    custom.optim_step(ADAM).result()
    plain.optim_step(ADAM).result()
    after = [np.concatenate(logprobs_of(c.forward(BATCH, "cross_entropy").result())) for c in (custom, plain)]
    assert np.allclose(after[0], after[1], atol=1e-5)


def datum_with_weights(d: types.Datum, factor: float) -> types.Datum:
    inputs = dict(d.loss_fn_inputs)
    inputs["weights"] = (np.asarray(inputs["weights"].tolist()) * factor).tolist()
    return types.Datum(model_input=d.model_input, loss_fn_inputs=inputs)


def test_the_sampler_serves_the_trained_weights_token_exactly(client):
    trainer = client.create_lora_training_client(base_model=NAME, rank=4, seed=4).result()
    for _ in range(3):
        trainer.forward_backward(BATCH, "cross_entropy")
        trainer.optim_step(ADAM)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, seed=7, temperature=1.0)
    prompt = types.ModelInput.from_ints(PROMPT)
    result = sampler.sample(prompt, 4, params, include_prompt_logprobs=True, topk_prompt_logprobs=3).result()
    assert len(result.sequences) == 4
    again = sampler.sample(prompt, 4, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # seeded
    # the prompt's log-probs are the learner's: the engine serves what the trainer trained
    learner = logprobs_of(trainer.forward([datum(PROMPT)], "cross_entropy").result())[0]
    assert result.prompt_logprobs[0] is None
    assert result.prompt_logprobs[1:] == pytest.approx(learner, abs=1e-4)
    for position, top in enumerate(result.topk_prompt_logprobs[1:], start=1):
        assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1]
        assert top[0][1] >= result.prompt_logprobs[position] - 1e-5
    # each sampled token's log-prob is the learner's on the sampled sequence (temperature 1)
    for sequence in result.sequences:
        full = PROMPT + sequence.tokens
        scored = logprobs_of(trainer.forward([datum(full)], "cross_entropy").result())[0]
        assert sequence.logprobs == pytest.approx(scored[len(PROMPT) - 1 :], abs=1e-4)
        assert sequence.stop_reason in ("stop", "length") and sequence.sequence_id
    computed = sampler.compute_logprobs(prompt).result()
    assert computed[1:] == pytest.approx(result.prompt_logprobs[1:], abs=1e-6)


def test_stop_tokens_and_strings_end_a_sample_with_the_stop_token(client):
    """``stop=[]`` runs to max_tokens past the end of sequence token; a stop token id, or its text, ends the
    sample with that token (the end of sequence token, 0, still stops)."""
    sampler = client.create_sampling_client(base_model=NAME).result()
    prompt = types.ModelInput.from_ints(PROMPT)
    for seed in range(20):  # a seed whose sample has a word before its end of sequence token
        free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=16, seed=seed, stop=[])).result()
        tokens = free.sequences[0].tokens
        assert len(tokens) == 16 and free.sequences[0].stop_reason == "length"
        natural = tokens[: tokens.index(0) + 1] if 0 in tokens else tokens
        if natural[0] >= 2:
            break
    stop_at = natural[0]
    expected = [stop_at]
    for stop in ([stop_at], [f"w{stop_at - 2}"]):
        stopped = sampler.sample(
            prompt, 1, types.SamplingParams(max_tokens=16, seed=seed, stop=stop)
        ).result()
        assert stopped.sequences[0].tokens == expected and stopped.sequences[0].stop_reason == "stop", stop


def test_state_round_trips_with_and_without_the_optimizer(client):
    trainer = client.create_lora_training_client(base_model=NAME, rank=4, seed=5).result()
    for _ in range(2):
        trainer.forward_backward(BATCH, "cross_entropy")
        trainer.optim_step(ADAM)
    path = trainer.save_state("two-steps").result().path
    assert path.endswith("/weights/two-steps")
    restored = client.create_training_client_from_state_with_optimizer(path).result()
    weights_only = client.create_training_client_from_state(path).result()
    before = [
        np.concatenate(logprobs_of(c.forward(BATCH, "cross_entropy").result()))
        for c in (trainer, restored, weights_only)
    ]
    assert np.allclose(before[0], before[1], atol=1e-6) and np.allclose(before[0], before[2], atol=1e-6)
    for c in (trainer, restored, weights_only):
        c.forward_backward(BATCH, "cross_entropy")
        c.optim_step(ADAM).result()
    after = [
        np.concatenate(logprobs_of(c.forward(BATCH, "cross_entropy").result()))
        for c in (trainer, restored, weights_only)
    ]
    assert np.allclose(after[0], after[1], atol=1e-5)  # Adam's moments came back with the weights
    assert not np.allclose(after[0], after[2], atol=1e-4)  # a fresh optimizer steps differently
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        weights_only.load_state_with_optimizer(path).result()
    reloaded = np.concatenate(logprobs_of(weights_only.forward(BATCH, "cross_entropy").result()))
    assert np.allclose(reloaded, before[0], atol=1e-6)


def test_the_rest_client_lists_and_deletes_checkpoints(server, client):
    trainer = client.create_lora_training_client(base_model=NAME, rank=2, seed=6).result()
    state = trainer.save_state("s", ttl_seconds=7200).result().path
    sampler = trainer.save_weights_for_sampler("w").result().path
    rest = tinker.RestClient(base_url=server[0], api_key=KEY)
    listed = rest.list_checkpoints(trainer.model_id).result().checkpoints
    assert {c.tinker_path: c.checkpoint_type for c in listed} == {state: "training", sampler: "sampler"}
    assert (
        all(c.size_bytes > 0 for c in listed) and next(c for c in listed if c.tinker_path == state).expires_at
    )
    run = rest.get_training_run_by_tinker_path(sampler).result()
    assert (run.base_model, run.is_lora, run.lora_rank) == (NAME, True, 2)
    assert run.last_checkpoint.tinker_path == state and run.last_sampler_checkpoint.tinker_path == sampler
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.lora_rank, info.train_unembed) == (NAME, 2, True)
    assert trainer.model_id in [
        r.training_run_id for r in rest.list_training_runs(limit=100).result().training_runs
    ]
    rest.delete_checkpoint_from_tinker_path(state).result()
    assert [c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints] == [sampler]
    from_file = client.create_sampling_client(model_path=sampler).result()
    assert (
        len(
            from_file.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=3))
            .result()
            .sequences
        )
        == 1
    )


def raw(url: str, path: str, key: str = KEY, **kwargs) -> httpx.Response:
    headers = {"X-API-Key": key, **kwargs.pop("headers", {})}
    return httpx.post(f"{url}{path}", headers=headers, timeout=30, **kwargs)


def test_requests_are_guarded_and_malformed_bodies_named(server, client):
    url = server[0]
    assert raw(url, "/api/v1/create_session", key="tml-wrong-key-0123456789", json={}).status_code == 401
    assert raw(url, "/api/v1/healthz", headers={"Host": "evil.example"}).status_code == 421
    assert (
        raw(url, "/api/v1/create_session", headers={"Origin": "http://evil.example"}, json={}).status_code
        == 403
    )
    answer = raw(
        url,
        "/api/v1/forward_backward",
        content=b"\xff\x01garbage",
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert answer.status_code == 400 and "ForwardBackwardRequest" in answer.json()["detail"]
    from tinker.proto import tinker_public_pb2 as pb

    message = pb.ForwardBackwardRequest(model_id="x", seq_id=1, loss_fn="cross_entropy")
    item = message.data.add()
    item.model_input.add().encoded_text.tokens = b"\x01\x00\x00"  # three bytes: not int32 tokens
    answer = raw(
        url,
        "/api/v1/forward_backward",
        content=message.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert answer.status_code == 400 and "data[0].model_input[0].tokens" in answer.json()["detail"]
    answer = raw(
        url, "/api/v1/create_model", json={"session_id": "x", "model_seq_id": "one", "base_model": NAME}
    )
    assert answer.status_code == 400 and "model_seq_id" in answer.json()["detail"]
    # another API key reaches nothing of this one's
    trainer = client.create_lora_training_client(base_model=NAME, rank=2).result()
    answer = raw(url, "/api/v1/get_info", key=OTHER_KEY, json={"model_id": trainer.model_id})
    assert answer.status_code == 404
    answer = raw(url, "/api/v1/get_info", json={"model_id": trainer.model_id})
    assert answer.status_code == 200 and answer.json()["model_id"] == trainer.model_id


def test_a_model_without_lora_trains_every_weight(server, client):
    """The SDK always asks for LoRA; the API takes a model without ``lora_config`` (full fine-tuning)."""
    session = client.holder.get_session_id()
    answer = raw(
        server[0],
        "/api/v1/create_model",
        json={"session_id": session, "model_seq_id": 99, "base_model": NAME},
    )
    assert answer.status_code == 200, answer.text
    request_id = answer.json()["request_id"]
    created = raw(server[0], "/api/v1/retrieve_future", json={"request_id": request_id}).json()
    model_id = created["model_id"]
    info = types.GetInfoResponse.model_validate(
        raw(server[0], "/api/v1/get_info", json={"model_id": model_id}).json()
    )
    assert info.is_lora is False
    trainer = tinker.TrainingClient(client.holder, model_seq_id=99, model_id=model_id, info=info)
    before = trainer.forward(BATCH, "cross_entropy").result()
    trainer.forward_backward(BATCH, "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = trainer.forward(BATCH, "cross_entropy").result()
    assert after.metrics["loss:sum"] < before.metrics["loss:sum"]
    sampler = trainer.save_weights_and_get_sampling_client().result()
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    learner = logprobs_of(trainer.forward([datum(PROMPT)], "cross_entropy").result())[0]
    assert scored[1:] == pytest.approx(learner, abs=1e-4)


def test_a_retried_submission_runs_once(server, client):
    """The SDK retries a submission whose answer it did not get: the same ``seq_id`` names the same request,
    which runs once (one optimizer step, not two)."""
    url = server[0]
    trainer = client.create_lora_training_client(base_model=NAME, rank=2, seed=7).result()
    trainer.forward_backward(BATCH[:2], "cross_entropy").result()  # one chunk, seq_id 1; then by hand
    step = {"model_id": trainer.model_id, "seq_id": 2, "adam_params": {"learning_rate": 0.05}}
    first, again = (raw(url, "/api/v1/optim_step", json=step).json() for _ in range(2))
    assert first["request_id"] == again["request_id"]
    save = {"model_id": trainer.model_id, "seq_id": 3, "path": "after-one-step"}
    saved = raw(url, "/api/v1/save_weights", json=save).json()
    path = raw(url, "/api/v1/retrieve_future", json={"request_id": saved["request_id"]}).json()["path"]
    reference = client.create_lora_training_client(base_model=NAME, rank=2, seed=7).result()
    reference.forward_backward(BATCH[:2], "cross_entropy")
    reference.optim_step(types.AdamParams(learning_rate=0.05)).result()
    restored = client.create_training_client_from_state(path).result()
    after = [
        np.concatenate(logprobs_of(c.forward(BATCH, "cross_entropy").result())) for c in (restored, reference)
    ]
    assert np.allclose(after[0], after[1], atol=1e-6)


def test_sampling_options_this_server_does_not_compute_are_refused_by_name(client):
    sampler = client.create_sampling_client(base_model=NAME).result()
    prompt = types.ModelInput.from_ints(PROMPT)
    with pytest.raises(tinker.BadRequestError, match="topk_sample_logprobs"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2), topk_sample_logprobs=2).result()


def test_a_model_keeps_the_weights_of_its_latest_samplers(client):
    from rlsdk.tinker.service import KEEP_SNAPSHOTS

    trainer = client.create_lora_training_client(base_model=NAME, rank=2, seed=8).result()
    samplers = [trainer.save_weights_and_get_sampling_client().result() for _ in range(KEEP_SNAPSHOTS + 1)]
    prompt, params = types.ModelInput.from_ints(PROMPT), types.SamplingParams(max_tokens=2)
    assert len(samplers[-1].sample(prompt, 1, params).result().sequences) == 1
    assert len(samplers[1].sample(prompt, 1, params).result().sequences) == 1
    with pytest.raises(tinker.RequestFailedError, match="were released"):
        samplers[0].sample(prompt, 1, params).result()
