"""The Tinker compatibility report: every public method of the pinned ``tinker`` client's ServiceClient,
TrainingClient, SamplingClient and RestClient, called against ``rlsdk tinker serve`` and checked, written as
``docs/tinker-compat.md`` (the table) and ``docs/tinker-compat.json`` (what CI holds the server to:
tests/test_tinker_compat.py runs the same checks and fails when a method that passed stops passing, or one
passes that the report does not list).

    python scripts/tinker_compat.py [--model PATH]   # default: a tiny random Llama built here

A method is *supported* when its check passed: the call returned and what it returned was checked (the
numbers against the training client's own, the objects the server keeps by listing them again). A method
that runs in the client alone (a console URL, telemetry) is marked so.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import chdir
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORT_MD = ROOT / "docs" / "tinker-compat.md"
REPORT_JSON = ROOT / "docs" / "tinker-compat.json"
CLASSES = ("ServiceClient", "TrainingClient", "SamplingClient", "RestClient")
NAME = "test/tiny-llama"
KEY = "tml-compat-report-0123456789"


def public_methods() -> dict[str, list[str]]:
    """Each client class's public methods, as the installed ``tinker`` defines them."""
    import tinker

    return {
        cls: sorted(
            name
            for name, value in inspect.getmembers(getattr(tinker, cls))
            if not name.startswith("_") and callable(value)
        )
        for cls in CLASSES
    }


@dataclass
class Context:
    """Clients and objects the checks share (made once, in order)."""

    url: str
    service: Any = None
    trainer: Any = None
    sampler: Any = None
    rest: Any = None
    state: str = ""
    sampler_path: str = ""
    base_logprobs: list[float] | None = None
    sampler_prompt_logprobs: list[float] | None = None
    """The training client's log-probs of the prompt when the sampler's snapshot was taken."""

    def data(self) -> list[Any]:
        from tinker import types

        return [
            types.Datum(
                model_input=types.ModelInput.from_ints([2 + i, 5, 9, 12, 3]),
                loss_fn_inputs={"target_tokens": [5, 9, 12, 3, 0], "weights": [0.0, 1.0, 1.0, 1.0, 1.0]},
            )
            for i in range(3)
        ]


def _run(awaitable: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return asyncio.run(_await(awaitable))


async def _await(awaitable: Any) -> Any:
    result = await awaitable
    return await result if inspect.isawaitable(result) else result  # *_async methods that return a future


def _logprobs(result: Any) -> list[float]:
    return [x for out in result.loss_fn_outputs for x in out["logprobs"].tolist()]


def _close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


Check = Callable[[Context], str]


def checks() -> dict[str, Check | str]:
    """Method -> its check (returns what it checked), or the reason it is not supported (a string)."""
    import tinker
    from tinker import types

    adam = types.AdamParams(learning_rate=1e-2)
    prompt = types.ModelInput.from_ints([2, 3, 4, 5])
    params = types.SamplingParams(max_tokens=4, seed=1)

    def sampled(client: Any, result: Any = None) -> str:
        result = result or client.sample(prompt, 2, params).result()
        _expect(
            len(result.sequences) == 2 and all(s.logprobs for s in result.sequences), "two sampled sequences"
        )
        return "2 sequences with per-token log-probs"

    def fresh_trainer(ctx: Context, **kw: Any) -> Any:
        return ctx.service.create_lora_training_client(base_model=NAME, rank=4, seed=0, **kw).result()

    def state_loaded(ctx: Context, client: Any) -> str:
        _expect(
            _close(_logprobs(client.forward(ctx.data(), "cross_entropy").result()), ctx.base_logprobs), ""
        )
        return "its forward log-probs equal the saved model's"

    def fb(ctx: Context, call: Callable[[], Any]) -> str:
        result = call()
        _expect(len(result.loss_fn_outputs) == 3 and "loss:sum" in result.metrics, "3 outputs and loss:sum")
        return "3 datums' log-probs and loss:sum"

    def custom(ctx: Context, call: Callable[[Any], Any]) -> str:
        def loss(data: Any, logprobs: Any) -> Any:
            total = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs))
            return total, {}

        result = call(loss)
        plain = ctx.trainer.forward(ctx.data(), "cross_entropy").result()
        _expect(abs(result.metrics["loss:sum"] - plain.metrics["loss:sum"]) < 1e-3, "custom loss equals CE")
        return "a custom loss equal to cross-entropy gives its loss"

    def save_state(ctx: Context, call: Callable[[], Any]) -> str:
        path = call().path
        listed = [c.tinker_path for c in ctx.rest.list_checkpoints(ctx.trainer.model_id).result().checkpoints]
        _expect(path in listed, f"{path} listed")
        return "the saved state is listed by the RestClient"

    def sampler_of(ctx: Context, client: Any) -> str:
        return sampled(client) + " from the saved weights"

    def rest_lists(kind: str) -> Check:
        def check(ctx: Context) -> str:
            getter = {
                "list_checkpoints": lambda: ctx.rest.list_checkpoints(ctx.trainer.model_id)
                .result()
                .checkpoints,
                "list_checkpoints_async": lambda: _run(
                    ctx.rest.list_checkpoints_async(ctx.trainer.model_id)
                ).checkpoints,
                "list_user_checkpoints": lambda: ctx.rest.list_user_checkpoints().result().checkpoints,
                "list_user_checkpoints_async": lambda: _run(
                    ctx.rest.list_user_checkpoints_async()
                ).checkpoints,
            }[kind]
            _expect(ctx.state in [c.tinker_path for c in getter()], "the state is listed")
            return "lists the state saved before"

        return check

    def runs(listing: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            _expect(
                ctx.trainer.model_id in [r.training_run_id for r in listing(ctx).training_runs], "run listed"
            )
            return "lists the training client's run"

        return check

    def run_of(getter: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            run = getter(ctx)
            _expect(
                run.training_run_id == ctx.trainer.model_id and run.lora_rank == 4, "the run's id and rank"
            )
            return "the run's id, base model and LoRA rank"

        return check

    def delete(call: Callable[[Context, str], Any]) -> Check:
        def check(ctx: Context) -> str:
            path = ctx.trainer.save_state(f"to-delete-{time.monotonic_ns()}").result().path
            call(ctx, path)
            listed = [
                c.tinker_path for c in ctx.rest.list_checkpoints(ctx.trainer.model_id).result().checkpoints
            ]
            _expect(path not in listed, "deleted")
            return "the checkpoint is no longer listed"

        return check

    def sessions(listing: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            _expect(ctx.service.holder.get_session_id() in listing(ctx).sessions, "session listed")
            return "lists this client's session"

        return check

    def session_of(getter: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            _expect(ctx.trainer.model_id in getter(ctx).training_run_ids, "the session's runs")
            return "the session's training runs"

        return check

    def sampler_info(getter: Callable[[Context, str], Any]) -> Check:
        def check(ctx: Context) -> str:
            info = getter(ctx, ctx.sampler._sampling_session_id)
            _expect(info.base_model == NAME, "base model")
            return "the sampler's base model"

        return check

    def ttl(call: Callable[[Context, str], Any]) -> Check:
        def check(ctx: Context) -> str:
            call(ctx, ctx.state)
            found = next(
                c
                for c in ctx.rest.list_checkpoints(ctx.trainer.model_id).result().checkpoints
                if c.tinker_path == ctx.state
            )
            _expect(found.expires_at is not None, "an expiry")
            return "the checkpoint gets an expiry"

        return check

    def publish(call: Callable[[Context, str], Any], public: bool) -> Check:
        def check(ctx: Context) -> str:
            call(ctx, ctx.state)
            found = next(
                c
                for c in ctx.rest.list_checkpoints(ctx.trainer.model_id).result().checkpoints
                if c.tinker_path == ctx.state
            )
            _expect(found.public is public, f"public={public}")
            return f"the checkpoint's public flag becomes {public}"

        return check

    def tokenizer(getter: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            _expect(getter(ctx).encode("w3 w4", add_special_tokens=False) == [5, 6], "the model's tokenizer")
            return "the served model's tokenizer (loaded offline)"

        return check

    def handle(ctx: Context) -> str:
        clone = tinker.SamplingClient.from_sampler_handle(ctx.sampler.get_sampler_handle(), api_key=KEY)
        return sampled(clone) + " from a client rebuilt from the handle"

    def custom_loss(ctx: Context) -> str:
        def neg_ll(logprobs: Any, weights: Any) -> Any:
            loss = -(logprobs * weights).sum()
            return loss, {"custom/neg_ll:sum": loss}

        handle_ = ctx.service.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result()
        return (
            custom(ctx, lambda _: ctx.trainer.forward_backward_custom(ctx.data(), handle_).result())
            + " (traced)"
        )

    def capabilities(getter: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            _expect(NAME in [m.model_name for m in getter(ctx).supported_models], "the model")
            return "lists the served model"

        return check

    def closed(ctx: Context) -> str:
        import httpx

        service = tinker.ServiceClient(base_url=ctx.url, api_key=KEY)
        trainer = service.create_lora_training_client(base_model=NAME, rank=2).result()
        service.close("success").result()
        answer = httpx.post(
            f"{ctx.url}/api/v1/get_info", json={"model_id": trainer.model_id}, headers={"X-API-Key": KEY}
        )
        _expect(answer.status_code == 404, "the closed session's model is gone")
        return "the session's models are released"

    def search(ctx: Context) -> str:
        found = ctx.rest.search_sessions(
            types.SessionSearchRequest(session_id=ctx.service.holder.get_session_id())
        ).result()
        _expect(
            [s.session_id for s in found.sessions] == [ctx.service.holder.get_session_id()], "one session"
        )
        return "finds this client's session by id"

    def usage(getter: Callable[[Context], Any]) -> Check:
        def check(ctx: Context) -> str:
            _expect(getter(ctx).data[0].checkpoint_count >= 1, "checkpoints counted")
            return "counts this key's checkpoints and their bytes"

        return check

    def external(call: Callable[[], Any]) -> str:
        path = call().path
        _expect("/external_weights/" in path, "an external_weights path")
        return "a merged Hugging Face folder saved as an external_weights checkpoint"

    def downloads(ctx: Context, urls_of: Callable[[str], Any]) -> str:
        import json as json_
        import urllib.error
        import urllib.request

        path = ctx.trainer.save_weights_external(f"x-{time.monotonic_ns()}").result().path
        urls = urls_of(path).urls
        _expect({"config.json", "model.safetensors"} <= set(urls), "the merged model's files")
        with urllib.request.urlopen(urls["config.json"]) as answer:  # a plain GET, no API key
            _expect("vocab_size" in json_.loads(answer.read()), "a model config")
        try:
            urllib.request.urlopen(urls["config.json"].replace("signature=", "signature=0"))
        except urllib.error.HTTPError as exc:
            _expect(exc.code == 401, "a wrong signature is refused")
        else:
            raise AssertionError("a wrong signature was accepted")
        return "signed URLs of the merged model's files download without the key; a forged one is refused"

    client_side = "client-side: "
    unsupported_billing = "not served: Thinking Machines' billing and audit services have no counterpart here"
    unsupported_projects = "not served: this server keeps no projects (one per API key)"
    return {
        # ServiceClient
        "ServiceClient.close": closed,
        "ServiceClient.copy_weights": unsupported_projects,
        "ServiceClient.create_custom_loss": custom_loss,
        "ServiceClient.create_lora_training_client": lambda ctx: (
            _expect(fresh_trainer(ctx).get_info().lora_rank == 4, "rank 4") or "a LoRA model of rank 4"
        ),
        "ServiceClient.create_lora_training_client_async": lambda ctx: (
            _expect(
                _run(ctx.service.create_lora_training_client_async(base_model=NAME, rank=2))
                .get_info()
                .lora_rank
                == 2,
                "rank 2",
            )
            or "a LoRA model of rank 2"
        ),
        "ServiceClient.create_rest_client": runs(
            lambda ctx: _run_sync(ctx.service.create_rest_client).list_training_runs(limit=1000).result()
        ),
        "ServiceClient.create_sampling_client": lambda ctx: sampled(
            ctx.service.create_sampling_client(base_model=NAME).result()
        ),
        "ServiceClient.create_sampling_client_async": lambda ctx: sampled(
            _run(ctx.service.create_sampling_client_async(base_model=NAME))
        ),
        "ServiceClient.create_training_client_from_state": lambda ctx: state_loaded(
            ctx, ctx.service.create_training_client_from_state(ctx.state).result()
        ),
        "ServiceClient.create_training_client_from_state_async": lambda ctx: state_loaded(
            ctx, _run(ctx.service.create_training_client_from_state_async(ctx.state))
        ),
        "ServiceClient.create_training_client_from_state_with_optimizer": lambda ctx: state_loaded(
            ctx, ctx.service.create_training_client_from_state_with_optimizer(ctx.state).result()
        ),
        "ServiceClient.create_training_client_from_state_with_optimizer_async": lambda ctx: state_loaded(
            ctx, _run(ctx.service.create_training_client_from_state_with_optimizer_async(ctx.state))
        ),
        "ServiceClient.get_console_url": client_side + "the Thinking Machines console's URL",
        "ServiceClient.get_server_capabilities": capabilities(
            lambda ctx: _run_sync(ctx.service.get_server_capabilities)
        ),
        "ServiceClient.get_server_capabilities_async": capabilities(
            lambda ctx: _run(ctx.service.get_server_capabilities_async())
        ),
        "ServiceClient.get_telemetry": client_side + "the SDK's own telemetry object",
        # TrainingClient
        "TrainingClient.create_sampling_client": lambda ctx: sampler_of(
            ctx, ctx.trainer.create_sampling_client(ctx.sampler_path).result()
        ),
        "TrainingClient.create_sampling_client_async": lambda ctx: sampler_of(
            ctx, _run(ctx.trainer.create_sampling_client_async(ctx.sampler_path))
        ),
        "TrainingClient.forward": lambda ctx: fb(
            ctx, lambda: ctx.trainer.forward(ctx.data(), "cross_entropy").result()
        ),
        "TrainingClient.forward_async": lambda ctx: fb(
            ctx, lambda: _run(ctx.trainer.forward_async(ctx.data(), "cross_entropy"))
        ),
        "TrainingClient.forward_backward": lambda ctx: fb(
            ctx, lambda: ctx.trainer.forward_backward(ctx.data(), "cross_entropy").result()
        ),
        "TrainingClient.forward_backward_async": lambda ctx: fb(
            ctx, lambda: _run(ctx.trainer.forward_backward_async(ctx.data(), "cross_entropy"))
        ),
        "TrainingClient.forward_backward_custom": lambda ctx: custom(
            ctx, lambda loss: ctx.trainer.forward_backward_custom(ctx.data(), loss).result()
        ),
        "TrainingClient.forward_backward_custom_async": lambda ctx: custom(
            ctx, lambda loss: _run(ctx.trainer.forward_backward_custom_async(ctx.data(), loss))
        ),
        "TrainingClient.get_console_url": client_side + "the Thinking Machines console's URL",
        "TrainingClient.get_info": lambda ctx: (
            _expect(ctx.trainer.get_info().model_data.model_name == NAME, "name")
            or "model id, base model, LoRA rank"
        ),
        "TrainingClient.get_info_async": lambda ctx: (
            _expect(_run(ctx.trainer.get_info_async()).model_id == ctx.trainer.model_id, "id")
            or "model id, base model, LoRA rank"
        ),
        "TrainingClient.get_telemetry": client_side + "the SDK's own telemetry object",
        "TrainingClient.get_tokenizer": tokenizer(lambda ctx: ctx.trainer.get_tokenizer()),
        "TrainingClient.load_state": lambda ctx: _load(ctx, ctx.trainer.load_state),
        "TrainingClient.load_state_async": lambda ctx: _load(
            ctx, lambda p: _run(ctx.trainer.load_state_async(p))
        ),
        "TrainingClient.load_state_with_optimizer": lambda ctx: _load(
            ctx, ctx.trainer.load_state_with_optimizer
        ),
        "TrainingClient.load_state_with_optimizer_async": lambda ctx: _load(
            ctx, lambda p: _run(ctx.trainer.load_state_with_optimizer_async(p))
        ),
        "TrainingClient.optim_step": lambda ctx: _optim(ctx, lambda: ctx.trainer.optim_step(adam).result()),
        "TrainingClient.optim_step_async": lambda ctx: _optim(
            ctx, lambda: _run(ctx.trainer.optim_step_async(adam))
        ),
        "TrainingClient.save_state": lambda ctx: save_state(
            ctx, lambda: ctx.trainer.save_state(f"s-{time.monotonic_ns()}").result()
        ),
        "TrainingClient.save_state_async": lambda ctx: save_state(
            ctx, lambda: _run(ctx.trainer.save_state_async(f"s-{time.monotonic_ns()}"))
        ),
        "TrainingClient.save_weights_and_get_sampling_client": lambda ctx: sampled(
            ctx.trainer.save_weights_and_get_sampling_client().result()
        ),
        "TrainingClient.save_weights_and_get_sampling_client_async": lambda ctx: sampled(
            _run(ctx.trainer.save_weights_and_get_sampling_client_async())
        ),
        "TrainingClient.save_weights_external": lambda ctx: external(
            lambda: ctx.trainer.save_weights_external(f"e-{time.monotonic_ns()}").result()
        ),
        "TrainingClient.save_weights_external_async": lambda ctx: external(
            lambda: _run(ctx.trainer.save_weights_external_async(f"e-{time.monotonic_ns()}"))
        ),
        "TrainingClient.save_weights_for_sampler": lambda ctx: _sampler_checkpoint(
            ctx, lambda n: ctx.trainer.save_weights_for_sampler(n).result()
        ),
        "TrainingClient.save_weights_for_sampler_async": lambda ctx: _sampler_checkpoint(
            ctx, lambda n: _run(ctx.trainer.save_weights_for_sampler_async(n))
        ),
        # SamplingClient
        "SamplingClient.compute_logprobs": lambda ctx: _scored(
            ctx, ctx.sampler.compute_logprobs(prompt).result()
        ),
        "SamplingClient.compute_logprobs_async": lambda ctx: _scored(
            ctx, _run(ctx.sampler.compute_logprobs_async(prompt))
        ),
        "SamplingClient.create": lambda ctx: sampled(
            tinker.SamplingClient.create(ctx.service.holder, base_model=NAME).result()
        ),
        "SamplingClient.from_sampler_handle": handle,
        "SamplingClient.get_base_model": lambda ctx: _expect(ctx.sampler.get_base_model() == NAME, "name")
        or "the base model's name",
        "SamplingClient.get_base_model_async": lambda ctx: _expect(
            _run(ctx.sampler.get_base_model_async()) == NAME, "name"
        )
        or "the base model's name",
        "SamplingClient.get_sampler_handle": handle,
        "SamplingClient.get_telemetry": client_side + "the SDK's own telemetry object",
        "SamplingClient.get_tokenizer": tokenizer(lambda ctx: ctx.sampler.get_tokenizer()),
        "SamplingClient.on_queue_state_change": client_side + "a callback the SDK calls with the queue state",
        "SamplingClient.sample": lambda ctx: sampled(ctx.sampler),
        "SamplingClient.sample_async": lambda ctx: sampled(
            ctx.sampler, _run(ctx.sampler.sample_async(prompt, 2, params))
        ),
        # RestClient
        "RestClient.assign_session_project": unsupported_projects,
        "RestClient.assign_session_project_async": unsupported_projects,
        "RestClient.copy_weights": unsupported_projects,
        "RestClient.copy_weights_async": unsupported_projects,
        "RestClient.delete_checkpoint": delete(
            lambda ctx, p: ctx.rest.delete_checkpoint(ctx.trainer.model_id, p.split("/", 3)[3]).result()
        ),
        "RestClient.delete_checkpoint_async": delete(
            lambda ctx, p: _run(ctx.rest.delete_checkpoint_async(ctx.trainer.model_id, p.split("/", 3)[3]))
        ),
        "RestClient.delete_checkpoint_from_tinker_path": delete(
            lambda ctx, p: ctx.rest.delete_checkpoint_from_tinker_path(p).result()
        ),
        "RestClient.delete_checkpoint_from_tinker_path_async": delete(
            lambda ctx, p: _run(ctx.rest.delete_checkpoint_from_tinker_path_async(p))
        ),
        "RestClient.export_session_trace": "not served: no session traces are recorded here",
        "RestClient.export_session_trace_async": "not served: no session traces are recorded here",
        "RestClient.get_audit_log": unsupported_billing,
        "RestClient.get_audit_log_async": unsupported_billing,
        "RestClient.get_billing_usage": unsupported_billing,
        "RestClient.get_billing_usage_async": unsupported_billing,
        "RestClient.get_current_checkpoint_storage_usage": usage(
            lambda ctx: _run_sync(ctx.rest.get_current_checkpoint_storage_usage).result()
        ),
        "RestClient.get_current_checkpoint_storage_usage_async": usage(
            lambda ctx: _run(ctx.rest.get_current_checkpoint_storage_usage_async())
        ),
        "RestClient.get_external_weights_urls": lambda ctx: downloads(
            ctx, lambda p: ctx.rest.get_external_weights_urls(p).result()
        ),
        "RestClient.get_external_weights_urls_async": lambda ctx: downloads(
            ctx, lambda p: _run(ctx.rest.get_external_weights_urls_async(p))
        ),
        "RestClient.get_sampler": sampler_info(lambda ctx, s: ctx.rest.get_sampler(s).result()),
        "RestClient.get_sampler_async": sampler_info(lambda ctx, s: _run(ctx.rest.get_sampler_async(s))),
        "RestClient.get_server_capabilities": capabilities(
            lambda ctx: ctx.rest.get_server_capabilities().result()
        ),
        "RestClient.get_session": session_of(
            lambda ctx: ctx.rest.get_session(ctx.service.holder.get_session_id()).result()
        ),
        "RestClient.get_session_async": session_of(
            lambda ctx: _run(ctx.rest.get_session_async(ctx.service.holder.get_session_id()))
        ),
        "RestClient.get_telemetry": client_side + "the SDK's own telemetry object",
        "RestClient.get_training_run": run_of(
            lambda ctx: ctx.rest.get_training_run(ctx.trainer.model_id).result()
        ),
        "RestClient.get_training_run_async": run_of(
            lambda ctx: _run(ctx.rest.get_training_run_async(ctx.trainer.model_id))
        ),
        "RestClient.get_training_run_by_tinker_path": run_of(
            lambda ctx: ctx.rest.get_training_run_by_tinker_path(ctx.state).result()
        ),
        "RestClient.get_training_run_by_tinker_path_async": run_of(
            lambda ctx: _run(ctx.rest.get_training_run_by_tinker_path_async(ctx.state))
        ),
        "RestClient.get_weights_info_by_tinker_path": lambda ctx: (
            _expect(ctx.rest.get_weights_info_by_tinker_path(ctx.state).result().lora_rank == 4, "rank")
            or "base model, LoRA rank and flags"
        ),
        "RestClient.list_checkpoints": rest_lists("list_checkpoints"),
        "RestClient.list_checkpoints_async": rest_lists("list_checkpoints_async"),
        "RestClient.list_sessions": sessions(lambda ctx: ctx.rest.list_sessions(limit=1000).result()),
        "RestClient.list_sessions_async": sessions(
            lambda ctx: _run(ctx.rest.list_sessions_async(limit=1000))
        ),
        "RestClient.list_training_runs": runs(lambda ctx: ctx.rest.list_training_runs(limit=1000).result()),
        "RestClient.list_training_runs_async": runs(
            lambda ctx: _run(ctx.rest.list_training_runs_async(limit=1000))
        ),
        "RestClient.list_user_checkpoints": rest_lists("list_user_checkpoints"),
        "RestClient.list_user_checkpoints_async": rest_lists("list_user_checkpoints_async"),
        "RestClient.publish_checkpoint_from_tinker_path": publish(
            lambda ctx, p: ctx.rest.publish_checkpoint_from_tinker_path(p).result(), True
        ),
        "RestClient.publish_checkpoint_from_tinker_path_async": publish(
            lambda ctx, p: _run(ctx.rest.publish_checkpoint_from_tinker_path_async(p)), True
        ),
        "RestClient.search_sessions": search,
        "RestClient.set_checkpoint_ttl_from_tinker_path": ttl(
            lambda ctx, p: ctx.rest.set_checkpoint_ttl_from_tinker_path(p, 7200).result()
        ),
        "RestClient.set_checkpoint_ttl_from_tinker_path_async": ttl(
            lambda ctx, p: _run(ctx.rest.set_checkpoint_ttl_from_tinker_path_async(p, 7200))
        ),
        "RestClient.unpublish_checkpoint_from_tinker_path": publish(
            lambda ctx, p: ctx.rest.unpublish_checkpoint_from_tinker_path(p).result(), False
        ),
        "RestClient.unpublish_checkpoint_from_tinker_path_async": publish(
            lambda ctx, p: _run(ctx.rest.unpublish_checkpoint_from_tinker_path_async(p)), False
        ),
        "RestClient.whoami": "not served: whoami reads a JWT; this server takes API keys (no JWT exchange)",
    }


def _run_sync(method: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return method()


def _load(ctx: Context, call: Callable[[str], Any]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = call(ctx.state)
    if hasattr(result, "result"):
        result.result()
    after = _logprobs(ctx.trainer.forward(ctx.data(), "cross_entropy").result())
    _expect(_close(after, ctx.base_logprobs), "the saved weights are back")
    return "the saved weights are back (forward log-probs equal)"


def _optim(ctx: Context, call: Callable[[], Any]) -> str:
    before = _logprobs(ctx.trainer.forward(ctx.data(), "cross_entropy").result())
    ctx.trainer.forward_backward(ctx.data(), "cross_entropy")
    metrics = call().metrics
    after = _logprobs(ctx.trainer.forward(ctx.data(), "cross_entropy").result())
    _expect(sum(after) > sum(before) and metrics["grad_norm:mean"] > 0, "the step raised the log-probs")
    return "a step raises the weighted log-probs; grad norm reported"


def _sampler_checkpoint(ctx: Context, call: Callable[[str], Any]) -> str:
    path = call(f"w-{time.monotonic_ns()}").path
    client = ctx.service.create_sampling_client(model_path=path).result()
    from tinker import types

    result = client.sample(
        types.ModelInput.from_ints([2, 3, 4, 5]), 1, types.SamplingParams(max_tokens=4)
    ).result()
    _expect(len(result.sequences) == 1, "samples")
    return "a sampler created from the saved path samples"


def _scored(ctx: Context, logprobs: list[float | None]) -> str:
    learner = ctx.sampler_prompt_logprobs or []
    _expect(logprobs[0] is None and _close([x or 0.0 for x in logprobs[1:]], learner, 1e-4), "the learner's")
    return "the prompt's log-probs equal the training client's forward pass at the snapshot"


def _datum(tokens: list[int]) -> Any:
    from tinker import types

    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def prepare(ctx: Context) -> None:
    """The shared clients: a trained model with a saved state and sampler checkpoint, its sampler."""
    import tinker

    ctx.service = tinker.ServiceClient(base_url=ctx.url, api_key=KEY)
    ctx.rest = tinker.RestClient(base_url=ctx.url, api_key=KEY)
    ctx.trainer = ctx.service.create_lora_training_client(base_model=NAME, rank=4, seed=0).result()
    ctx.trainer.forward_backward(ctx.data(), "cross_entropy")
    ctx.trainer.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
    ctx.state = ctx.trainer.save_state("base").result().path
    ctx.sampler_path = ctx.trainer.save_weights_for_sampler("base-sampler").result().path
    ctx.base_logprobs = _logprobs(ctx.trainer.forward(ctx.data(), "cross_entropy").result())
    ctx.sampler = ctx.trainer.save_weights_and_get_sampling_client().result()
    scored = ctx.trainer.forward([_datum([2, 3, 4, 5])], "cross_entropy").result()
    ctx.sampler_prompt_logprobs = _logprobs(scored)


def run_checks(url: str, model_folder: Path) -> list[dict[str, Any]]:
    """Every public method's row: ``method``, ``supported`` (passed, client-side, or not), ``checked``."""
    table = checks()
    ctx = Context(url)
    rows = []
    with tempfile.TemporaryDirectory() as work, chdir(work):
        # recipes load the tokenizer by the model's name: a folder of that name in the working directory
        (Path(work) / NAME).parent.mkdir(parents=True)
        os.symlink(model_folder, Path(work) / NAME)
        prepare(ctx)
        for cls, methods in public_methods().items():
            for method in methods:
                name = f"{cls}.{method}"
                check = table.get(name)
                if check is None:
                    rows.append(
                        {
                            "method": name,
                            "supported": "no",
                            "checked": "not in this report's checks (new in the client?)",
                        }
                    )
                elif isinstance(check, str):
                    supported = "client-side" if check.startswith("client-side") else "no"
                    rows.append(
                        {
                            "method": name,
                            "supported": supported,
                            "checked": check.removeprefix("client-side: "),
                        }
                    )
                else:
                    try:
                        rows.append({"method": name, "supported": "yes", "checked": check(ctx)})
                    except Exception as exc:  # noqa: BLE001 -- the report names what failed
                        detail = f"FAILED: {type(exc).__name__}: {str(exc)[:200]}"
                        print(name, "".join(traceback.format_exception(exc))[-2000:], file=sys.stderr)
                        rows.append({"method": name, "supported": "failed", "checked": detail})
        ctx.service.close("success").result()
    return rows


def render(rows: list[dict[str, Any]], tinker_version: str) -> str:
    served = sum(r["supported"] == "yes" for r in rows)
    client = sum(r["supported"] == "client-side" for r in rows)
    lines = [
        "# Tinker compatibility report",
        "",
        f"Every public method of the pinned `tinker` {tinker_version} client's ServiceClient, TrainingClient,",
        "SamplingClient and RestClient, called against `rlsdk tinker serve` (the tiny CPU Llama of the test",
        "suite) by `scripts/tinker_compat.py`, which wrote this page; CI runs the same checks",
        "(`tests/test_tinker_compat.py`) and fails when a method that passed stops passing.",
        "",
        f"**{served} of {len(rows)} methods served and checked**, {client} more run in the client alone.",
        "",
        "| method | supported | what was checked |",
        "|---|---|---|",
    ]
    lines += [f"| `{r['method']}` | {r['supported']} | {r['checked']} |" for r in rows]
    return "\n".join(lines) + "\n"


def tiny_llama(folder: Path) -> Path:
    """The test suite's tiny Llama (:func:`rlsdk.testing.tiny_llama`): 2 layers, hidden size 32, a 32-word
    vocabulary."""
    from rlsdk import testing

    return testing.tiny_llama(folder)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="a local model folder (default: the tiny Llama)")
    args = parser.parse_args()
    import tinker
    from rlsdk_embedded.engine import EmbeddedEngine

    from rlsdk.tinker.server import ServerThread
    from rlsdk.tinker.service import TinkerService
    from rlsdk.tinker.training import Placement

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.model or tiny_llama(Path(scratch) / "tiny-llama")
        service = TinkerService(
            {NAME: folder},
            lambda f: EmbeddedEngine(str(f), device="cpu", threads=1),
            Path(scratch) / "checkpoints",
            Placement("cpu", "float32", 1),
        )
        with ServerThread(service, [KEY]) as url:
            rows = run_checks(url, folder)
    REPORT_MD.write_text(render(rows, tinker.__version__))
    REPORT_JSON.write_text(json.dumps({"tinker": tinker.__version__, "methods": rows}, indent=1) + "\n")
    failed = [r["method"] for r in rows if r["supported"] == "failed"]
    print(f"wrote {REPORT_MD} and {REPORT_JSON}; failed: {failed or 'none'}")


if __name__ == "__main__":
    main()
