"""Delta weight sync (slime's ``--update-weight-mode delta``): the trainer publishes only the changed bytes of
each sync, the engine's host patches its local checkpoint and every tensor is checked; on the tiny Llama's real
checkpoint files."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlsdk.engines.delta_weights import INDEX, LocalCheckpoint, read_checkpoint
from rlsdk.training.delta_sync import DeltaPublisher


def trained(weights: dict[str, torch.Tensor], names: list[str], seed: int) -> dict[str, torch.Tensor]:
    """A copy of ``weights`` (tied tensors stay tied) with a small step on 2% of each of ``names``."""
    generator = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(weights)
    for name in names:
        flat = out[name].view(-1)
        count = max(1, flat.numel() // 50)
        flat[:count] += 1e-3 * torch.randn(count, generator=generator)
    return out


def loaded(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


@pytest.mark.parametrize(("encoding", "checksum"), [("xor", "xxh3-128"), ("overwrite", "adler32")])
def test_versions_carry_only_the_changed_bytes_and_rebuild_the_trainers_weights(tiny_llama, tmp_path, encoding, checksum):
    model = loaded(tiny_llama)  # tied embeddings: lm_head.weight is in the state dict, not in the files
    names = sorted(read_checkpoint(tiny_llama))
    publisher = DeltaPublisher(tmp_path / "shared", tiny_llama, encoding, checksum)
    local = LocalCheckpoint(tmp_path / "local", tiny_llama)

    step1 = trained(model, names[:3], seed=1)
    folder, sizes = publisher.publish(step1)
    assert folder.name == "weight_v000001" and sizes["tensors"] == 3
    assert sizes["bytes"] < sizes["raw_bytes"] / 20  # a 2% change of three tensors, compressed
    local.pull(publisher.folder, 1)
    step2 = trained(step1, names[2:5], seed=2)
    publisher.publish(step2)
    local.pull(publisher.folder, 2)
    assert local.version == 2
    rebuilt = loaded(local.folder)
    for name in names:
        assert torch.equal(rebuilt[name], step2[name]), name
    meta = json.loads((publisher.folder / "weight_v000002" / INDEX).read_text())["metadata"]["delta"]
    assert (meta["base_version"], meta["encoding"], meta["checksum"]) == (1, encoding, checksum)
    assert sorted(meta["tensors"]) == names[2:5]


def test_a_version_out_of_order_or_corrupt_never_reaches_the_checkpoint(tiny_llama, tmp_path):
    model = loaded(tiny_llama)
    names = sorted(read_checkpoint(tiny_llama))
    publisher = DeltaPublisher(tmp_path / "shared", tiny_llama, "xor", "xxh3-128")
    publisher.publish(trained(model, names[:1], seed=1))
    publisher.publish(trained(model, names[:2], seed=2))
    local = LocalCheckpoint(tmp_path / "local", tiny_llama)
    local.materialize()
    (local.folder / local.STATE).write_text(json.dumps({"version": 1}))  # claims v1 without having it
    with pytest.raises(ValueError, match=r"does not match its checksum after the delta"):
        local.pull(publisher.folder, 2)  # xor applied on the wrong base
    assert local.version == 1
    fresh = LocalCheckpoint(tmp_path / "fresh", tiny_llama)
    fresh.materialize()
    with pytest.raises(ValueError, match="applies on version 1"):
        fresh._apply(publisher.folder / "weight_v000002")


def test_a_tensor_the_base_lacks_is_an_error(tiny_llama, tmp_path):
    publisher = DeltaPublisher(tmp_path / "shared", tiny_llama)
    with pytest.raises(ValueError, match="lacks"):
        publisher.publish({**loaded(tiny_llama), "extra.weight": torch.zeros(2)})


@pytest.mark.plugins("rlsdk_embedded")
def test_a_training_run_syncs_deltas_and_the_engine_serves_the_trainers_weights(tiny_llama, run_files, tmp_path):
    """slime's delta flags on a real run: each sync publishes a version, the engine's local checkpoint takes
    it and the engine reloads it; the weights check compares every tensor the engine serves with the
    trainer's after each sync (any difference stops the run). 4 prompts x 8 samples: a step whose every group
    got equal rewards (1 in 10 at 2 x 4 with this reward) would train nothing and sync no delta."""
    from rlsdk import RolloutConfig
    from rlsdk.run.job import run_job

    data, reward = run_files
    shared, local = tmp_path / "shared", tmp_path / "local"
    args = RolloutConfig.from_dict({
        "model": str(tiny_llama), "prompt_data": str(data), "rm_type": reward, "train": True, "lr": 3e-2,
        "num_rollout": 2, "rollout_batch_size": 4, "n_samples_per_prompt": 8, "rollout_max_response_len": 4,
        "update_weight_mode": "delta", "update_weight_transport": "disk", "update_weight_disk_dir": str(shared),
        "update_weight_local_checkpoint_dir": str(local), "update_weight_delta_checksum": "adler32",
        "weights_check": "on", "output_dir": str(tmp_path / "run"), "engine_threads": 1, "train_threads": 1,
    })
    out = run_job(args)
    rows = [json.loads(line) for line in (out.folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/sync_delta_tensors"] > 0 for r in rows] == [True, True]
    assert all(r["train/sync_delta_bytes"] < r["train/sync_delta_raw_bytes"] for r in rows)
    assert sorted(p.name for p in shared.iterdir()) == ["weight_v000001", "weight_v000002"]
    assert json.loads((local / LocalCheckpoint.STATE).read_text())["version"] == 2
