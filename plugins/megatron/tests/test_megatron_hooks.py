"""slime's megatron hooks as plugin kinds, called by the ``megatron`` trainer where slime's megatron backend calls
them: ``megatron_init`` once megatron's parallel state is up and before the model is built, ``megatron_before_
log_prob`` before each log-prob computation (``store_prefix`` ``""`` or ``"ref_"``), ``megatron_before_train_step``
before each optimizer step's passes, ``model_provider`` in place of the trainer's ``GPTModel``. The trainer is
the real one, in one process on gloo (CPU, float32) on a tiny Llama, with megatron's CUDA assumptions pointed
at the CPU (cpu_megatron.py). Skipped where megatron-core cannot be imported.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (cp312 wheels only)")

from rlsdk import (  # noqa: E402
    MegatronBeforeLogProb,
    MegatronBeforeTrainStep,
    MegatronInit,
    ModelProvider,
    PluginCallError,
    RolloutConfig,
    Runtime,
    Sample,
    get_plugin_manager,
    hookimpl,
)
from rlsdk import load_callable  # noqa: E402
from rlsdk.testing import bind_runtime, make_train_groups  # noqa: E402

CPU_MEGATRON = Path(__file__).with_name("cpu_megatron.py")
TINY = load_callable(f"{CPU_MEGATRON}:tiny_llama")(
    hidden_size=32, intermediate_size=48, vocab_size=64, max_position_embeddings=32, rope_theta=10000.0
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return load_callable(f"{CPU_MEGATRON}:save_tiny")(tmp_path_factory.mktemp("tiny-llama"), TINY)


@pytest.fixture(scope="module")
def cpu_process_group():
    import torch.distributed as dist

    from rlsdk.trainer_api import free_port

    patches = pytest.MonkeyPatch()
    load_callable(f"{CPU_MEGATRON}:patch_for_cpu")(patches.setattr)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    patches.undo()


def groups() -> list[list[Sample]]:
    return make_train_groups(size=4, length=7, response_length=3, vocab=TINY["vocab_size"])


def trainer_with(folder: Path, plugin: Any, **options: Any) -> Any:
    """The megatron trainer on the CPU, ``plugin`` registered in the run's plugin manager."""
    from rlsdk_megatron.trainer import MegatronTrainer

    args = RolloutConfig(
        hf_checkpoint=str(folder), train=True, trainer="megatron", train_dtype="float32", lr=1e-2, **options
    )
    pm = get_plugin_manager(load_entrypoints=False, plugins=[plugin])
    runtime = bind_runtime(args, Runtime(pm, None))  # type: ignore[arg-type]  (no engine: the trainer alone)
    runtime.loop.close()
    torch.set_num_threads(1)
    return MegatronTrainer(args, torch.device("cpu"))


def test_hooks_run_where_slime_calls_them(folder, cpu_process_group):
    from megatron.core import parallel_state

    events: list[tuple[Any, ...]] = []

    def init(args):
        events.append(("init", parallel_state.model_parallel_is_initialized()))

    def before_log_prob(args, model, store_prefix):
        events.append(("log_prob", store_prefix, model))

    def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
        grads = [p.grad for p in model[0].parameters() if p.grad is not None]
        events.append(("train_step", rollout_id, step_id, model, optimizer, opt_param_scheduler, grads))
        for group in optimizer.param_groups:  # the hook's change takes effect in this step
            group["lr"] = 0.0

    class Hooks:
        @hookimpl
        def rlsdk_megatron_inits(self):
            yield MegatronInit(name="record_init", func=init)

        @hookimpl
        def rlsdk_megatron_before_log_probs(self):
            yield MegatronBeforeLogProb(name="record_log_prob", func=before_log_prob)

        @hookimpl
        def rlsdk_megatron_before_train_steps(self):
            yield MegatronBeforeTrainStep(name="freeze", func=before_train_step)

    trainer = trainer_with(
        folder,
        Hooks(),
        custom_megatron_init_path="record_init",
        custom_megatron_before_log_prob_hook_path="record_log_prob",
        custom_megatron_before_train_step_hook_path="freeze",
        global_batch_size=4,  # two optimizer steps for the 8 samples
        use_kl_loss=True,
        kl_loss_coef=0.1,
    )
    try:
        assert events == [("init", True)]  # once, megatron initialised, before any log-prob or step
        before = {
            k: v.clone() for k, v in trainer.model.state_dict().items() if not k.endswith("_extra_state")
        }
        trainer.train_step(3, groups())
        after = trainer.model.state_dict()
    finally:
        trainer.close()
    log_probs = [e for e in events if e[0] == "log_prob"]
    assert [e[1] for e in log_probs] == ["", "ref_"]  # the old policy's, then the reference model's
    assert log_probs[0][2] == [trainer.model] and log_probs[1][2] == [trainer.ref_model]
    steps = [e for e in events if e[0] == "train_step"]
    assert [(e[1], e[2]) for e in steps] == [(3, 0), (3, 1)]
    for _, _, _, model, optimizer, scheduler, grads in steps:
        assert model == [trainer.model] and optimizer is trainer.optimizer and scheduler is None
        assert grads == []  # called with the gradients cleared, before the step's passes
    assert all(torch.equal(before[k], after[k]) for k in before)  # lr 0 from the hook: nothing moved


def test_model_provider_builds_the_model_the_checkpoint_is_loaded_into(folder, cpu_process_group):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from rlsdk_megatron.attention import SDPAttention

    calls: list[dict[str, Any]] = []

    def provider(pre_process, post_process, vp_stage=None, config=None, model_kwargs=None):
        calls.append({"pre_process": pre_process, "post_process": post_process, "vp_stage": vp_stage})
        spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
        model = GPTModel(config=config, transformer_layer_spec=spec, **model_kwargs)
        model.built_by = "provider"
        return model

    class Provider:
        @hookimpl
        def rlsdk_model_providers(self):
            yield ModelProvider(name="local_spec", func=provider)

    samples = [s for g in groups() for s in g]
    default = trainer_with(folder, Provider())
    try:
        expected = default.response_log_probs(samples)
    finally:
        default.close()
    trainer = trainer_with(folder, Provider(), custom_model_provider_path="local_spec")
    try:
        assert getattr(trainer.model, "built_by", None) == "provider"
        assert calls == [{"pre_process": True, "post_process": True, "vp_stage": None}]
        # the checkpoint's weights were loaded into the provider's model: the same function as the default's
        got = trainer.response_log_probs(samples)
        metrics = trainer.train_step(0, groups())
    finally:
        trainer.close()
    for a, b in zip(got, expected, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert metrics["train/optimizer_steps"] == 1


def test_a_provided_model_that_does_not_fit_the_checkpoint_names_the_provider(folder, cpu_process_group):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    def one_layer(pre_process, post_process, config=None, model_kwargs=None):
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
        return GPTModel(
            config=dataclasses.replace(config, num_layers=1), transformer_layer_spec=spec, **model_kwargs
        )

    class Provider:
        @hookimpl
        def rlsdk_model_providers(self):
            yield ModelProvider(name="one_layer", func=one_layer)
            yield ModelProvider(name="not_a_model", func=lambda pre_process, post_process: {"layers": 2})

    with pytest.raises(KeyError, match=r"do not fit the model of model_provider 'one_layer' .*unexpected"):
        trainer_with(folder, Provider(), custom_model_provider_path="one_layer")
    with pytest.raises(
        PluginCallError, match=r"model_provider 'not_a_model' .* built dict, which has no parameters"
    ):
        trainer_with(folder, Provider(), custom_model_provider_path="not_a_model")


def test_a_failing_hook_is_an_error_naming_it(folder, cpu_process_group):
    def broken(args, model, store_prefix):
        raise RuntimeError("no such buffer")

    class Hooks:
        @hookimpl
        def rlsdk_megatron_before_log_probs(self):
            yield MegatronBeforeLogProb(name="broken", func=broken)

    trainer = trainer_with(folder, Hooks(), custom_megatron_before_log_prob_hook_path="broken")
    try:
        with pytest.raises(
            PluginCallError,
            match=r"megatron_before_log_prob 'broken' .* before the policy log-probs raised RuntimeError: no such",
        ):
            trainer.response_log_probs([s for g in groups() for s in g])
    finally:
        trainer.close()
