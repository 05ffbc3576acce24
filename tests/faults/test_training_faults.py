"""A loss that goes wrong (T4, T5, T6): named with its plugin, never blamed on the engine, never a silent
step. ``rlsdk run --train`` on the tiny Llama (``tiny_llama`` in tests/conftest.py) with loss plugins
registered in process."""

from __future__ import annotations

import json

import pytest
import torch

from rlsdk import Loss, get_plugin_manager, hookimpl
from rlsdk.errors import RlsdkError
from rlsdk.run.job import run_job

pytestmark = pytest.mark.plugins("rlsdk_embedded")


class InfiniteGradient(torch.autograd.Function):
    """0 forward, an infinite gradient backward: an overflow in the backward pass."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sum() * 0

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.full_like(x, float("inf"))


class BadLosses:
    @hookimpl
    def rlsdk_losses(self):
        def nan_loss(args, batch, logits, reduce):
            loss = logits.float().sum() * float("nan")
            return loss, {"loss": loss.detach()}

        def detached_loss(args, batch, logits, reduce):
            loss = logits.detach().float().mean()
            return loss, {"loss": loss}

        def infinite_gradient(args, batch, logits, reduce):
            loss = InfiniteGradient.apply(logits.float()) + 1.0
            return loss, {"loss": loss.detach()}

        yield Loss(name="nan_loss", func=nan_loss)
        yield Loss(name="detached_loss", func=detached_loss)
        yield Loss(name="infinite_gradient", func=infinite_gradient)


@pytest.fixture
def args(tiny_run):
    def make(loss):
        return tiny_run(
            n_samples_per_prompt=4, num_rollout=1, loss_type="custom_loss", custom_loss_function_path=loss
        )

    return make


def test_a_nan_loss_is_named_not_blamed_on_the_engine(args):
    with pytest.raises(RlsdkError, match=r"loss 'nan_loss' .*gave a non-finite loss \(nan\) on the samples"):
        run_job(args("nan_loss"), get_plugin_manager(plugins=[BadLosses()]))


def test_a_loss_without_gradients_is_a_clear_error(args):
    with pytest.raises(RlsdkError, match=r"loss 'detached_loss' .*returned a loss without gradients"):
        run_job(args("detached_loss"), get_plugin_manager(plugins=[BadLosses()]))


def test_an_infinite_gradient_norm_skips_the_update_with_a_warning(args, tmp_path):
    with pytest.warns(
        RuntimeWarning, match="the gradient norm is (inf|nan) .*this optimizer step is skipped"
    ):
        run_job(args("infinite_gradient"), get_plugin_manager(plugins=[BadLosses()]))
    [row] = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert row["train/skipped_optimizer_steps"] == 1
    assert row["train/sync_logprob_max_diff"] < 1e-3  # the weights are as they were, on both sides
