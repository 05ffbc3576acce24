"""Tensor-, data-, expert- and pipeline-parallel megatron training in 2 (or 4) real processes on gloo (CPU,
float32) computes what one process computes: per-token log-probs, a train step's loss and grad norm, and
the weights after it (gathered and converted back to Hugging Face format), on a tiny GQA Llama whose
127-token vocabulary tensor parallelism must pad, a tiny tied Qwen3 and a tiny Qwen3-MoE. Rank 0 is this
process, the others subprocesses, as ``rlsdk run`` starts them; megatron-core's own parallel layers,
pipeline schedule and collectives run on gloo, with its CUDA assumptions pointed at the CPU
(cpu_megatron.py). Each rank loads its split of the weights into a real tensor-parallel
``GPTModel`` with ``load_state_dict`` (which refuses a wrong shape), so the split's shard shapes are
megatron's. Skipped where megatron-core cannot be imported.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (cp312 wheels only)")

from rlsdk import RolloutConfig, Sample  # noqa: E402
from rlsdk import load_callable  # noqa: E402
from rlsdk_megatron.rank_group import RankFailedError, RankGroupTrainer  # noqa: E402

CPU_MEGATRON = Path(__file__).with_name("cpu_megatron.py")
TINY = load_callable(f"{CPU_MEGATRON}:tiny_llama")()


TINY_MOE = {
    **{k: v for k, v in TINY.items() if k not in ("rope_theta",)},
    "model_type": "qwen3_moe",
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
}

TINY_QWEN3 = {
    **{k: v for k, v in TINY_MOE.items() if not k.startswith(("moe_", "num_experts", "norm_topk"))},
    "model_type": "qwen3",
    "tie_word_embeddings": True,
}
"""Qwen3 dense (QK norms) with tied embeddings, as Qwen3-4B has them."""


save_tiny = load_callable(f"{CPU_MEGATRON}:save_tiny")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), TINY)


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen3-moe"), TINY_MOE)


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen3"), TINY_QWEN3)


def groups() -> list[list[Sample]]:
    rng = random.Random(0)
    out = []
    for g in range(2):
        prompt = [rng.randrange(TINY["vocab_size"]) for _ in range(6)]
        out.append(
            [
                Sample(
                    group_index=g,
                    index=i,
                    tokens=prompt + [rng.randrange(TINY["vocab_size"]) for _ in range(3 + i)],
                    response_length=3 + i,
                    reward=rng.choice([-1.0, 1.0]),
                    status=Sample.Status.COMPLETED,
                )
                for i in range(4)
            ]
        )
    return out


def config(folder: Path, **sizes: Any) -> RolloutConfig:
    # two optimizer steps by default
    options = {"global_batch_size": 4, "micro_batch_size": 1, "loss_type": "sft_loss", **sizes}
    return RolloutConfig(
        hf_checkpoint=str(folder),
        train=True,
        trainer="megatron",
        train_dtype="float32",
        lr=1e-2,
        adam_eps=1.0,  # updates proportional to the gradients: Adam's g / sqrt(v) would magnify rounding
        clip_grad=0.5,  # clips: the norm must be the whole model's
        **options,
    )


def run(trainer, samples: list[Sample]) -> dict:
    before = trainer.response_log_probs(samples)
    metrics = trainer.train_step(0, groups())
    weights = {k: v.detach().clone() for k, v in trainer.weights().items()}
    return {"log_probs": before, "metrics": metrics, "weights": weights}


@pytest.fixture(scope="module")
def one_process(folder):
    return one_process_result(folder)


@pytest.fixture(scope="module")
def one_process_moe(moe_folder):
    return one_process_result(moe_folder, global_batch_size=3)


@pytest.fixture(scope="module")
def one_process_qwen3(qwen3_folder):
    return one_process_result(qwen3_folder)


def one_process_result(folder: Path, **options: int) -> dict:
    import torch.distributed as dist
    from megatron.core import parallel_state

    patches = pytest.MonkeyPatch()
    load_callable(f"{CPU_MEGATRON}:patch_for_cpu")(patches.setattr)
    samples = [s for g in groups() for s in g]
    try:
        trainer = load_callable(f"{CPU_MEGATRON}:cpu_trainer")(config(folder, **options))
        result = run(trainer, samples)
        initial = load_callable("rlsdk_megatron.trainer:read_hf_weights")(folder)
        initial.setdefault("lm_head.weight", initial["model.embed_tokens.weight"])  # a tied model's
        result["initial"] = initial
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    finally:
        patches.undo()
    return result


@pytest.mark.parametrize(
    "sizes",
    [
        {"tensor_model_parallel_size": 2},
        {"actor_num_gpus_per_node": 2},
    ],
    ids=["tensor-parallel-2", "data-parallel-2"],
)
def test_two_processes_train_as_one(folder, one_process, sizes, tmp_path):
    check_processes(folder, one_process, sizes, tmp_path)


def test_expert_parallel_moe_trains_as_one_process(moe_folder, one_process_moe, tmp_path):
    """A Qwen3-MoE (4 experts, top-2) with its experts split over 2 ranks (data-parallel 2, each rank 2
    experts, tokens exchanged all-to-all on gloo): the same log-probs, loss, grad norm (experts counted on
    their ranks) and weights after the step (every expert gathered back under its whole-model name).
    Global batches of 3 give the ranks 2 and 1 samples: the second runs an empty pass to meet the first's
    all-to-all exchanges."""
    sizes = {"expert_model_parallel_size": 2, "global_batch_size": 3}
    check_processes(moe_folder, one_process_moe, sizes, tmp_path)


def check_processes(
    folder: Path, one_process: dict, sizes: dict, tmp_path: Path, world: int = 2, resume: bool = True
) -> None:
    """``world`` processes with parallel ``sizes`` train as one process did (``one_process``); with
    ``resume`` a checkpoint they save resumes exactly."""
    patches = pytest.MonkeyPatch()
    load_callable(f"{CPU_MEGATRON}:patch_for_cpu")(patches.setattr)
    samples = [s for g in groups() for s in g]
    args = config(folder, **sizes)
    trainer = RankGroupTrainer(f"{CPU_MEGATRON}:cpu_trainer", args, world, tmp_path / "logs")
    try:
        result = run(trainer, samples)
        whole = sum(t.numel() * t.element_size() for t in result["weights"].values())
        bucket_bytes = whole // 4  # above any one weight of these shapes
        buckets = [{k: v.clone() for k, v in b.items()} for b in trainer.weight_buckets(bucket_bytes)]
        checkpoint = tmp_path / "checkpoint"
        if resume:
            trainer.save_checkpoint(checkpoint)
            after_save = trainer.train_step(1, groups())
            trainer.load_checkpoint(checkpoint)
            after_load = trainer.train_step(1, groups())
    finally:
        trainer.close()
        patches.undo()

    gap = max(
        abs(a - b)
        for row, ref in zip(result["log_probs"], one_process["log_probs"], strict=True)
        for a, b in zip(row, ref, strict=True)
    )
    assert gap < 1e-4, f"log-probs differ from one process by {gap:.3g} nats"
    metrics, reference = result["metrics"], one_process["metrics"]
    for key in ("train/loss", "train/grad_norm"):
        assert metrics[key] == pytest.approx(reference[key], rel=1e-5), key
    assert metrics.keys() == reference.keys()
    assert result["weights"].keys() == one_process["weights"].keys()
    tied = json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", False)
    check_buckets(buckets, result["weights"], bucket_bytes, tied)
    for name, tensor in one_process["weights"].items():
        diff = (result["weights"][name] - tensor).abs().max()
        assert diff < 1e-6, f"{name}: {diff:.3g}"
        moved = (tensor - one_process["initial"][name]).abs().max()
        assert moved > 0, f"{name} did not train"
    if not resume:
        return
    index = checkpoint / "model.safetensors.index.json"  # saved one bucket per file
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        assert set(weight_map) == set(result["weights"]) - ({"lm_head.weight"} if tied else set())
        assert all((checkpoint / file).exists() for file in set(weight_map.values()))
    # A checkpoint resumes exactly: the step after it, repeated after loading it, is the same step.
    assert after_load["train/loss"] == pytest.approx(after_save["train/loss"], rel=1e-6)
    assert all((checkpoint / f"rank-{rank}" / "optimizer.pt").exists() for rank in range(1, world))


def check_buckets(buckets: list[dict], weights: dict, bucket_bytes: int, tied: bool) -> None:
    """The weights came as several buckets of at most ``bucket_bytes`` (a tied model's ``lm_head`` is the
    embedding, not counted), in layer order (each stage's after the one before), together the whole model."""
    assert len(buckets) >= 3
    for bucket in buckets:
        size = sum(
            t.numel() * t.element_size() for n, t in bucket.items() if not (tied and n == "lm_head.weight")
        )
        assert size <= bucket_bytes, sorted(bucket)
    names = [name for bucket in buckets for name in bucket]
    assert len(names) == len(set(names)) and set(names) == set(weights)
    layers = [int(name.split(".")[2]) for name in names if name.startswith("model.layers.")]
    assert layers == sorted(layers)
    for bucket in buckets:
        for name, tensor in bucket.items():
            assert torch.equal(tensor, weights[name]), name


def test_the_weights_are_gathered_and_converted_one_bucket_at_a_time(folder):
    """Taking the first bucket converts that bucket's weights and no others (the rest wait until asked),
    so a sync never holds the whole model in Hugging Face form; the buckets put together are
    :meth:`weights`."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    import rlsdk_megatron.trainer as trainer_module

    converted: list[str] = []
    convert = trainer_module.megatron_to_hf

    def counting(state, config):
        out = convert(state, config)
        converted.extend(out)
        return out

    patches = pytest.MonkeyPatch()
    load_callable(f"{CPU_MEGATRON}:patch_for_cpu")(patches.setattr)
    patches.setattr(trainer_module, "megatron_to_hf", counting)
    try:
        trainer = load_callable(f"{CPU_MEGATRON}:cpu_trainer")(config(folder))
        buckets = trainer.weight_buckets(50_000)
        first = next(buckets)
        assert converted == list(first)
        rest = list(buckets)
        whole = trainer.weights()
        assert len(rest) >= 4
        assert [n for b in [first, *rest] for n in b] == list(whole)
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    finally:
        patches.undo()


def test_tensor_parallel_moe_trains_as_one_process(moe_folder, one_process_moe, tmp_path):
    """A Qwen3-MoE with tensor parallelism 2: attention split over the ranks, the sequence too
    (megatron's MoE layers need sequence parallelism: each rank routes its part of the tokens to the
    experts it holds whole), the norms' and routers' gradients summed over the ranks; the same log-probs,
    loss, grad norm and weights after the step (rows padded to a multiple of 2 tokens)."""
    sizes = {"tensor_model_parallel_size": 2, "global_batch_size": 3}
    check_processes(moe_folder, one_process_moe, sizes, tmp_path)


def test_pipeline_parallel_tied_qwen3_trains_as_one_process(qwen3_folder, one_process_qwen3, tmp_path):
    """A Qwen3 dense model (QK norms) with tied embeddings over 2 pipeline stages: the embedding on the
    first stage, its copy as the output layer on the last, their gradients summed over the two and the
    copy counted once in the grad norm; the same log-probs, loss, grad norm and weights after the step. Its
    checkpoint is written (and resumed) one 20 kB bucket per file."""
    sizes = {"pipeline_model_parallel_size": 2, "update_weight_buffer_size": 20_000}
    check_processes(qwen3_folder, one_process_qwen3, sizes, tmp_path)
    assert len(list((tmp_path / "checkpoint").glob("model-*-of-*.safetensors"))) > 3


def test_pipeline_parallel_moe_trains_as_one_process(moe_folder, one_process_moe, tmp_path):
    """A Qwen3-MoE (4 experts, top-2, every expert on each rank) over 2 pipeline stages, one MoE layer
    each: the same log-probs, loss, grad norm and weights after the step."""
    sizes = {"pipeline_model_parallel_size": 2, "global_batch_size": 3}
    check_processes(moe_folder, one_process_moe, sizes, tmp_path)


def test_pipeline_parallel_with_a_packed_loss_trains_as_one_process(folder, one_process, tmp_path):
    """A loss plugin that reads slime's packed logits (every position's; here sft_loss's function, which
    the one-process reference ran on the response positions' logits) over 2 pipeline stages: the last
    stage hands it the packed logits; the same loss, grad norm and weights after the step."""
    sizes = {
        "pipeline_model_parallel_size": 2,
        "loss_type": "custom_loss",
        "custom_loss_function_path": f"{CPU_MEGATRON}:packed_sft_loss",
    }
    check_processes(folder, one_process, sizes, tmp_path, resume=False)


def test_pipeline_parallel_with_a_model_provider_trains_as_one_process(folder, one_process, tmp_path):
    """A ``model_provider`` (by file path, so that each rank resolves it) builds each of 2 pipeline stages'
    models, asked for the first stage's embedding (``pre_process``) and the last one's output layer
    (``post_process``): the same log-probs, loss, grad norm and weights after the step as one process with
    the trainer's own model."""
    sizes = {"pipeline_model_parallel_size": 2, "custom_model_provider_path": f"{CPU_MEGATRON}:local_gpt"}
    check_processes(folder, one_process, sizes, tmp_path, resume=False)


def test_pipeline_and_tensor_parallel_train_as_one_process(folder, one_process, tmp_path):
    """4 processes: 2 pipeline stages, each split over 2 tensor-parallel ranks (the stage's weights
    gathered over its tensor-parallel ranks, then sent to rank 0). Pipeline checkpoints are checked with
    two processes (the tied Qwen3)."""
    sizes = {"pipeline_model_parallel_size": 2, "tensor_model_parallel_size": 2}
    check_processes(folder, one_process, sizes, tmp_path, world=4, resume=False)


def test_pipeline_data_and_expert_parallel_moe_trains_as_one_process(moe_folder, one_process_moe, tmp_path):
    """4 processes: 2 pipeline stages, 2 data-parallel replicas whose ranks split the experts (2 each).
    Global batches of 3 give the replicas 2 and 1 samples: the second runs an empty pass through its
    stages to meet the first's all-to-all exchanges."""
    sizes = {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2, "global_batch_size": 3}
    check_processes(moe_folder, one_process_moe, sizes, tmp_path, world=4, resume=False)


def test_pipeline_sizes_that_cannot_work_are_refused_by_name(tmp_path):
    """Stages that would hold different numbers of layers (3 layers over 2 stages) stop the ranks as they
    start, with the reason."""
    three_layers = save_tiny(tmp_path / "three-layers", {**TINY, "num_hidden_layers": 3})
    patches = pytest.MonkeyPatch()
    load_callable(f"{CPU_MEGATRON}:patch_for_cpu")(patches.setattr)
    args = config(three_layers, pipeline_model_parallel_size=2)
    try:
        with pytest.raises(
            (ValueError, RankFailedError), match="pipeline-parallel size 2 does not divide the 3 layers"
        ):
            RankGroupTrainer(f"{CPU_MEGATRON}:cpu_trainer", args, 2, tmp_path / "logs")
    finally:
        patches.undo()


def test_tensor_parallel_qwen3_trains_as_one_process(qwen3_folder, one_process_qwen3, tmp_path):
    """Qwen3's query and key norms act on each tensor-parallel rank's own heads: their gradients are
    summed over the ranks (the grad norm and the weights after the step differed without it)."""
    check_processes(qwen3_folder, one_process_qwen3, {"tensor_model_parallel_size": 2}, tmp_path)


def test_four_way_expert_parallel_moe_trains_as_one_process(moe_folder, one_process_moe, tmp_path):
    """4 processes, 4 data-parallel replicas whose ranks hold one expert each (EP=4, the widest split of
    the 4 experts; the layout of issue 55's four-GPU MoE run). Global batches of 3: the fourth replica
    runs an empty pass to meet the others' all-to-all exchanges."""
    sizes = {"expert_model_parallel_size": 4, "global_batch_size": 3}
    check_processes(moe_folder, one_process_moe, sizes, tmp_path, world=4, resume=False)
