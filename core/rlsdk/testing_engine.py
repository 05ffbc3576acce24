"""The engine contract of :mod:`rlsdk.testing`: what every engine a run may use must do, as checks that take an
engine (started, in front of the tiny Llama :func:`tiny_llama` writes) and an :class:`EngineKit`. Its
answers must be real tokens and log-probs: the checks compare them with the torch trainer's on the same
weights. :func:`check_engine_contract` runs one check; rlsdk's own tests run all of them against the SGLang
client (``tests/test_engine_contract.py``) and the vllm engine (``plugins/engine_vllm``)::

    @pytest.mark.parametrize("name", ENGINE_CONTRACT)
    def test_my_engine(name, tiny_llama, tmp_path):
        kit = EngineKit.for_model(tiny_llama, tmp_path)
        if reason := check_engine_contract(name, lambda: MyEngine(tiny_llama), kit):
            pytest.skip(reason)

The checks may run one after another on one engine (as ``benchmarks/gpu/vllm_checks.py`` runs them on a real
vLLM): each leaves the engine serving the trainer's weights, with no adapter loaded and not paused.

A check the engine under test cannot serve where the test runs (CUDA IPC and memory release need GPUs unless
a stand-in serves them: :attr:`EngineKit.serves`) returns the reason it was skipped.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import RolloutConfig
from .engines.engine import InferenceEngine
from .engines.protocol import EngineRequestError
from .types import Sample

PROMPT = [2, 3, 4, 5]
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@dataclass
class EngineKit:
    """What the checks use besides the engine: the model folder, a torch trainer on it (its weights are the
    truth the engine's log-probs are held to), a folder to write in, and what the engine serves where the
    test runs beyond the protocol every engine speaks."""

    model: Path
    trainer: Any
    work: Path
    serves: set[str] = field(default_factory=set)
    """``"tensor"`` (CUDA IPC from a colocated trainer), ``"release"`` (memory release and resume)."""
    rejects: dict[str, str] = field(default_factory=dict)
    """What the engine refuses by design (keys of :data:`REFUSALS`) -> a pattern of its error's text."""
    tolerance: float = 1e-3
    """Nats the engine's log-probs may differ from the trainer's by: two float32 computations of one (the
    default) differ by about 1e-4; an engine on a GPU computes them with other kernels."""

    @classmethod
    def for_model(cls, model: Path, work: Path, **options: Any) -> EngineKit:
        """A kit with a float32 torch trainer on ``model`` (one thread)."""
        from .training.torch_trainer import TorchTrainer

        trainer = TorchTrainer(RolloutConfig(hf_checkpoint=str(model), train=True, train_threads=1))
        return cls(model=Path(model), trainer=trainer, work=Path(work), **options)


class Skipped(Exception):
    """The engine under test cannot serve this check where it runs."""


Check = Callable[[InferenceEngine, EngineKit], Awaitable[None]]
_CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    _CHECKS[fn.__name__] = fn
    return fn


def check_engine_contract(
    name: str, make_engine: Callable[[], InferenceEngine], kit: EngineKit, timeout: float = 120.0
) -> str | None:
    """Run the check ``name`` against an engine ``make_engine`` builds (started, then closed) in an event loop
    of its own; None when it passed, the reason when the engine cannot serve it here (an AssertionError or
    the engine's own error when it failed)."""

    async def run() -> None:
        engine = make_engine()
        await engine.start()
        try:
            await asyncio.wait_for(_CHECKS[name](engine, kit), timeout)
        finally:
            await engine.close()

    try:
        asyncio.run(run())
    except Skipped as skipped:
        return str(skipped)
    return None


async def refused(call: Awaitable[Any], pattern: str) -> None:
    """``call`` raises :class:`rlsdk.EngineRequestError` whose text matches ``pattern``."""
    try:
        await call
    except EngineRequestError as exc:
        assert re.search(pattern, str(exc)), f"refused with {exc!s}, expected {pattern!r}"
        return
    raise AssertionError(f"not refused (expected {pattern!r})")


def tiny_llama(folder: Path) -> Path:
    """A 2-layer Llama with hidden size 32, 4,096 positions and random weights (seed 0) over a 32-word vocabulary (``<eos>``,
    ``<pad>``, ``w0`` ... ``w29``: a word-level tokenizer), tied embeddings, saved in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<eos>", "<pad>", *[f"w{i}" for i in range(30)]]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>").save_pretrained(
        folder
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return Path(folder)


async def generate(engine: InferenceEngine, **params: Any) -> dict[str, Any]:
    body = {"input_ids": list(PROMPT), "return_logprob": True, "sampling_params": {**GREEDY, **params}}
    answer = await engine.generate(body)
    assert isinstance(answer, dict)
    return answer


async def started(engine: InferenceEngine, rid: str, tokens: int = 2000) -> asyncio.Task[Any]:
    """A long request running on the engine (it has produced a token, or waits only behind the engine)."""
    task = asyncio.ensure_future(
        engine.generate(
            {
                "input_ids": list(PROMPT),
                "rid": rid,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": tokens, **GREEDY},
            }
        )
    )
    for _ in range(200):
        load = await engine.load()
        if load["num_running_reqs"] + load["num_waiting_reqs"] or task.done():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    return task


def trainer_log_probs(kit: EngineKit, prompt: list[int], response: list[int]) -> list[float]:
    sample = Sample(group_index=0, index=0, tokens=[*prompt, *response], response_length=len(response))
    return kit.trainer.response_log_probs([sample])[0]


def gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def within(served: list[float], truth: list[float], tolerance: float, what: str) -> None:
    """The engine's log-probs ``served`` are ``what`` (``truth``) within ``tolerance`` nats."""
    largest = gap(served, truth)
    assert largest < tolerance, (
        f"{what}: log-probs differ by up to {largest:.3g} nats (tolerance {tolerance:g})"
    )


def changed_model(kit: EngineKit, name: str, seed: int) -> Path:
    """The model with every weight nudged, saved as a Hugging Face folder; the trainer holds it too."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in kit.trainer.model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    folder = kit.work / name
    shutil.rmtree(folder, ignore_errors=True)
    kit.trainer.save_hf_model(folder)
    return folder


# ------------------------------------------------------------------------------------ generation


@check
async def generates_tokens_with_their_log_probs(engine: InferenceEngine, kit: EngineKit) -> None:
    answer = await generate(engine, max_new_tokens=5)
    meta = answer["meta_info"]
    assert len(answer["output_ids"]) == 5 and meta["completion_tokens"] == 5 and meta["prompt_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert [e[1] for e in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(e[0] <= 0 for e in meta["output_token_logprobs"])
    assert isinstance(meta["weight_version"], str)
    again = await generate(engine, max_new_tokens=5)
    assert again["output_ids"] == answer["output_ids"]  # greedy


@check
async def log_probs_are_the_models(engine: InferenceEngine, kit: EngineKit) -> None:
    """Sampled at temperature 1: each token's log-prob is the trainer's for that token, to float32."""
    answer = await generate(engine, max_new_tokens=8, temperature=1.0)
    served = [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
    within(served, trainer_log_probs(kit, PROMPT, answer["output_ids"]), kit.tolerance, "the trainer's")


@check
async def a_batch_answers_each_prompt(engine: InferenceEngine, kit: EngineKit) -> None:
    other = [7, 8, 9]
    batch = await engine.generate(
        {"input_ids": [list(PROMPT), other], "sampling_params": {"max_new_tokens": 3, **GREEDY}}
    )
    assert isinstance(batch, list) and len(batch) == 2
    single = await engine.generate({"input_ids": other, "sampling_params": {"max_new_tokens": 3, **GREEDY}})
    assert isinstance(single, dict) and batch[1]["output_ids"] == single["output_ids"]


@check
async def a_stop_token_ends_the_response_and_stays_in_it(engine: InferenceEngine, kit: EngineKit) -> None:
    free = (await generate(engine, max_new_tokens=6))["output_ids"]
    stop = free[2]
    answer = await generate(engine, max_new_tokens=6, stop_token_ids=[stop])
    ids = answer["output_ids"]
    assert ids == free[: free.index(stop) + 1]
    assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


@check
async def a_stream_is_cumulative_and_ends_finished(engine: InferenceEngine, kit: EngineKit) -> None:
    whole = await generate(engine, max_new_tokens=6)
    body = {
        "input_ids": list(PROMPT),
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 6, **GREEDY},
    }
    chunks = [chunk async for chunk in engine.generate_stream(body)]
    ids = [c["output_ids"] for c in chunks]
    assert all(later[: len(earlier)] == earlier for earlier, later in zip(ids, ids[1:], strict=False))
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert ids[-1] == whole["output_ids"]
    assert len(chunks[-1]["meta_info"]["output_token_logprobs"]) == 6


@check
async def the_trust_checks_probe_scores_the_prompt(engine: InferenceEngine, kit: EngineKit) -> None:
    """``logprob_start_len`` with ``max_new_tokens: 0``: the log-probs the trust check compares."""
    from .training.sync import engine_log_probs

    response = [9, 10, 11, 12]
    sample = Sample(group_index=0, index=0, tokens=[*PROMPT, *response], response_length=len(response))
    served = await engine_log_probs(engine, sample)
    within(served, trainer_log_probs(kit, PROMPT, response), kit.tolerance, "the trainer's")


@check
async def the_runs_health_check_passes(engine: InferenceEngine, kit: EngineKit) -> None:
    from .plugins.kinds import Engine
    from .plugins.records import PluginInfo, Resolved
    from .run.engine_health import check_engine_health

    resolved = Resolved(
        Engine(name="under-test", func=lambda args: engine), PluginInfo("the engine under test")
    )
    await check_engine_health(engine, resolved, 60.0)
    problem = getattr(engine, "health_problem", None)
    if problem is not None:
        assert await problem(10.0) is None


# ------------------------------------------------------------------------------------ control


@check
async def aborting_one_request_returns_what_it_made(engine: InferenceEngine, kit: EngineKit) -> None:
    running = await started(engine, "contract-one")
    await engine.abort("contract-one")
    answer = await asyncio.wait_for(running, 60)
    ids = answer["output_ids"]
    assert answer["meta_info"]["finish_reason"]["type"] == "abort" and len(ids) < 2000
    assert [e[1] for e in answer["meta_info"]["output_token_logprobs"]] == ids


@check
async def aborting_all_ends_every_request(engine: InferenceEngine, kit: EngineKit) -> None:
    first, second = await started(engine, "contract-a"), await started(engine, "contract-b")
    await engine.abort()
    answers = await asyncio.wait_for(asyncio.gather(first, second), 60)
    assert [a["meta_info"]["finish_reason"]["type"] for a in answers] == ["abort", "abort"]


@check
async def a_pause_that_aborts_holds_new_requests_until_resumed(
    engine: InferenceEngine, kit: EngineKit
) -> None:
    running = await started(engine, "contract-pause")
    await engine.pause("abort")
    assert (await asyncio.wait_for(running, 60))["meta_info"]["finish_reason"]["type"] == "abort"
    waiting = asyncio.ensure_future(generate(engine, max_new_tokens=3))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await engine.resume()
    assert len((await asyncio.wait_for(waiting, 60))["output_ids"]) == 3


@check
async def a_pause_in_place_keeps_requests_to_finish_after_resume(
    engine: InferenceEngine, kit: EngineKit
) -> None:
    running = await started(engine, "contract-keep")
    await engine.pause("in_place")
    await asyncio.sleep(0.3)
    assert not running.done()
    await engine.resume()
    answer = await asyncio.wait_for(running, 60)
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 2000}


@check
async def load_counts_requests_and_wait_idle_returns(engine: InferenceEngine, kit: EngineKit) -> None:
    running = await started(engine, "contract-load")
    load = await engine.load()
    assert load["num_running_reqs"] + load["num_waiting_reqs"] >= 1
    await engine.abort()
    await asyncio.wait_for(running, 60)
    await engine.wait_idle(30)
    assert await engine.load() == {"num_running_reqs": 0, "num_waiting_reqs": 0}
    assert await engine.flush_cache() is True


@check
async def what_the_engine_cannot_do_is_refused_by_name(engine: InferenceEngine, kit: EngineKit) -> None:
    if not kit.rejects:
        raise Skipped("the engine refuses none of the contract's requests")
    for name, pattern in kit.rejects.items():
        await refused(REFUSALS[name](engine), pattern)


REFUSALS: dict[str, Callable[[InferenceEngine], Awaitable[Any]]] = {
    "retract": lambda engine: engine.pause("retract"),
    "image": lambda engine: engine.generate({"text": "w1", "image_data": ["x.png"]}),
    "n": lambda engine: engine.generate({"input_ids": [1], "sampling_params": {"n": 2}}),
}


# ------------------------------------------------------------------------------------ weights


@check
async def a_disk_sync_serves_the_new_weights_as_the_version_given(
    engine: InferenceEngine, kit: EngineKit
) -> None:
    from .training.sync import DiskSync, trust_check

    before = await generate(engine, max_new_tokens=6, temperature=1.0)
    folder = changed_model(kit, "step-7", seed=7)
    await DiskSync(folder).push(engine, kit.trainer, "7")
    assert (await engine.model_info())["weight_version"] == "7"
    answer = await generate(engine, max_new_tokens=6, temperature=1.0)
    assert answer["meta_info"]["weight_version"] == "7"
    served = [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
    within(served, trainer_log_probs(kit, PROMPT, answer["output_ids"]), kit.tolerance, "the trainer's")
    old = [e[0] for e in before["meta_info"]["output_token_logprobs"]]
    assert (
        gap(old, trainer_log_probs(kit, PROMPT, before["output_ids"])) > 10 * kit.tolerance
    )  # the sync mattered
    probe = Sample(group_index=0, index=0, tokens=[*PROMPT, 9, 10], response_length=2)
    assert await trust_check(engine, kit.trainer, probe, tolerance=kit.tolerance) < kit.tolerance


@check
async def the_weight_version_is_the_one_set_last(engine: InferenceEngine, kit: EngineKit) -> None:
    await engine.update_weight_version("lora-9")
    assert (await engine.model_info())["weight_version"] == "lora-9"
    assert (await generate(engine, max_new_tokens=1))["meta_info"]["weight_version"] == "lora-9"


@check
async def the_weights_check_finds_every_tensor_equal_then_one_changed(
    engine: InferenceEngine, kit: EngineKit
) -> None:
    import torch

    from .training.sync import WeightSyncError
    from .training.trust import check_weights

    if await engine.weight_checksums() is None:
        raise Skipped("the engine reports no weight checksums (the trust check compares log-probs alone)")
    verdict = await check_weights(engine, kit.trainer, 1)
    assert verdict.complete, verdict
    changed = kit.trainer.model.state_dict()["model.layers.1.mlp.up_proj.weight"]
    original = changed.detach().clone()
    with torch.no_grad():
        changed.add_(1.0)
    try:
        await check_weights(engine, kit.trainer, 2)
    except WeightSyncError as exc:
        assert "up_proj" in str(exc), exc
    else:
        raise AssertionError("a changed tensor passed the weights check")
    finally:
        with torch.no_grad():
            changed.copy_(original)  # the trainer holds the engine's weights again


@check
async def a_lora_adapter_loads_serves_and_unloads(engine: InferenceEngine, kit: EngineKit) -> None:
    folder, merged = lora_adapter(kit)
    base = await generate(engine, max_new_tokens=4, temperature=1.0)
    await engine.load_lora_adapter("contract-lora", str(folder))
    with_adapter = await generate(engine, max_new_tokens=4, temperature=1.0)
    served = [e[0] for e in with_adapter["meta_info"]["output_token_logprobs"]]
    within(served, merged(with_adapter["output_ids"]), kit.tolerance, "the model merged with the adapter")
    moved = gap(served, trainer_log_probs(kit, PROMPT, with_adapter["output_ids"]))
    assert moved > 10 * kit.tolerance, (
        f"the adapter moved the log-probs by only {moved:.3g} nats, not over 10x the tolerance {kit.tolerance:g}"
    )
    await engine.unload_lora_adapter("contract-lora")
    after = await generate(engine, max_new_tokens=4, temperature=1.0)
    served = [e[0] for e in after["meta_info"]["output_token_logprobs"]]
    within(served, trainer_log_probs(kit, PROMPT, after["output_ids"]), kit.tolerance, "the base model's")
    assert base["meta_info"]["weight_version"] == after["meta_info"]["weight_version"]


def random_lora(model: Any, folder: Path) -> Any:
    """``model`` with a random (non-zero) rank-4 LoRA adapter on its attention projections, the adapter saved
    in PEFT's format in ``folder``: the PEFT model (torch's generator seeded by the caller)."""
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    peft_model.save_pretrained(str(folder))
    return peft_model


def lora_adapter(kit: EngineKit) -> tuple[Path, Callable[[list[int]], list[float]]]:
    """A random rank-4 adapter on the attention projections in PEFT's format (in the kit's folder), and the
    log-probs of a response under the trainer's weights (the engine's) merged with it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(kit.model, dtype=torch.float32)
    model.load_state_dict({k: v.float().cpu() for k, v in kit.trainer.model.state_dict().items()})
    folder = kit.work / "adapter"
    peft_model = random_lora(model, folder)

    def log_probs(response: list[int]) -> list[float]:
        with torch.no_grad():
            ids = torch.tensor([[*PROMPT, *response]])
            logits = peft_model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]
            return (
                torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(PROMPT) :, None])[:, 0].tolist()
            )

    return folder, log_probs


@check
async def a_colocated_sync_releases_memory_and_serves_the_trainers_weights(
    engine: InferenceEngine, kit: EngineKit
) -> None:
    """slime's order: memory released for the train step, weights back, the trainer's tensors by CUDA IPC,
    then the cache; the trust check after it passes."""
    from .training.sync import ColocatedTensorSync, trust_check

    if not {"tensor", "release"} <= kit.serves:
        raise Skipped("CUDA IPC and memory release need GPUs here (no stand-in serves them)")
    sync = ColocatedTensorSync(release=True, bucket_bytes=20_000)  # several buckets
    await sync.before_train(engine)
    waiting = asyncio.ensure_future(generate(engine, max_new_tokens=2))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing runs while the memory is released
    changed_model(kit, "ipc", seed=11)
    await sync.push(engine, kit.trainer, "3")
    assert sync.timings["buckets"] > 1
    await asyncio.wait_for(waiting, 60)
    probe = Sample(group_index=0, index=0, tokens=[*PROMPT, 9, 10, 11], response_length=3)
    assert await trust_check(engine, kit.trainer, probe, tolerance=kit.tolerance) < kit.tolerance
    assert (await engine.model_info())["weight_version"] == "3"


@check
async def a_sync_in_place_pauses_around_the_update(engine: InferenceEngine, kit: EngineKit) -> None:
    """Without a release (``--no-offload-rollout``) the engine keeps its memory: the update runs paused in
    place, a request in flight finishes after it, and the cache is flushed."""
    from .training.sync import ColocatedTensorSync

    if "tensor" not in kit.serves:
        raise Skipped("CUDA IPC needs GPUs here (no stand-in serves it)")
    running = await started(engine, "contract-inplace")
    changed_model(kit, "inplace", seed=13)
    await ColocatedTensorSync(release=False).push(engine, kit.trainer, "4")
    answer = await asyncio.wait_for(running, 60)
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 2000}
    after = await generate(engine, max_new_tokens=4, temperature=1.0)
    served = [e[0] for e in after["meta_info"]["output_token_logprobs"]]
    within(served, trainer_log_probs(kit, PROMPT, after["output_ids"]), kit.tolerance, "the trainer's")


ENGINE_CONTRACT: tuple[str, ...] = tuple(_CHECKS)
"""The names of the engine contract's checks, for :func:`check_engine_contract`."""


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def processes_gone(pids: list[int], timeout: float = 10.0) -> bool:
    """Whether every process of ``pids`` is gone within ``timeout`` seconds (an engine's launched servers
    after its ``close``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(process_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@contextmanager
def ray_test_cluster(env_vars: dict[str, str], gpus: int = 2) -> Iterator[None]:
    """A local Ray cluster for the test inside: 2 logical CPUs, ``gpus`` declared GPUs (the machine need not
    have them: engines under test that need none, stand-ins, take them), a 200 MiB object store, no dashboard,
    and ``env_vars`` in every worker's environment. Shut down after."""
    import ray

    ray.init(
        num_cpus=2,
        num_gpus=gpus,
        include_dashboard=False,
        object_store_memory=200 << 20,
        log_to_driver=False,
        runtime_env={"env_vars": env_vars},
    )
    try:
        yield
    finally:
        ray.shutdown()
