"""A run's session: its plugins resolved once, the engine built through its call point, started, checked
and served on loopback when it has no URL of its own, the tokenizer loaded; everything closed on the way
out. The Ray wiring (:mod:`.ray_wiring`) swaps the engine and trainer for actors here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from urllib.parse import urlparse

from ..config import RolloutConfig
from ..data.eval_sets import check_eval_datasets
from ..engines.protocol import SERVE_TOKEN_ENV
from ..engines.run_tokens import new_token
from ..plugins.calls import call_engine
from ..plugins.manager import RlsdkPluginManager, get_plugin_manager
from ..plugins.run_plugins import RunPlugins
from ..runtime import Runtime, bind_runtime, tuned_garbage_collector
from .engine_health import check_engine_health
from .engine_server import start_server
from .ray_wiring import on_ray


def resolve_run_plugins(args: RolloutConfig, pm: RlsdkPluginManager | None = None) -> RunPlugins:
    """Every plugin the run names, resolved (and checked) once, before any model loads; the eval datasets'
    files, rewards and generators too."""
    plugins = RunPlugins(args, pm or get_plugin_manager())
    plugins.resolve_all()
    check_eval_datasets(args, plugins)
    return plugins


def open_runtime(args: RolloutConfig, plugins: RunPlugins) -> Runtime:
    """Start the engine and check its health; serve it over HTTP on loopback when it has no URL of its
    own (or a LoRA adapter to name), so slime-style generators that POST to ``/generate`` reach it; load
    the tokenizer."""
    # engine: built by its plugin from the run's settings
    runtime = Runtime(plugins.pm, call_engine(plugins.engine, args), run_plugins=plugins)
    try:
        runtime.run(runtime.engine.start())
        # a dead or broken engine stops the run here, before any data is taken
        runtime.run(check_engine_health(runtime.engine, plugins.engine, args.generate_timeout))
        url = runtime.engine.url
        if url is None or args.lora_rank:  # with LoRA, a /generate reaches the engine through its client,
            # which names the adapter (lora_path) for generators that POST to the URL themselves
            runtime.server = runtime.run(
                start_server(
                    runtime.engine,
                    host="127.0.0.1",
                    port=0,
                    pm=plugins.pm,
                    tool_call_parser=args.choices["tool_call_parser"],
                    # a secret of its own: no other local process may pause or drive it (T24)
                    token=os.environ.get(SERVE_TOKEN_ENV) or new_token(),
                    trust_own_process=True,  # the run's own code, slime-style raw HTTP clients included
                )
            )
            url = runtime.server.url
        runtime.args = run_args(args, runtime, url, getattr(runtime.engine, "model_path", None))
        runtime.tokenizer = getattr(runtime.engine, "tokenizer", None) or load_tokenizer(runtime.args)
    except BaseException:
        close_runtime(runtime)
        raise
    return runtime


def run_args(config: RolloutConfig, runtime: Runtime, url: str, model_path: Any) -> RolloutConfig:
    """The one view of a run's configuration its plugins get as ``args``: ``config`` with what the run learned
    under slime's names (``sglang_router_ip``/``_port``: the engine's address, ``hf_checkpoint``: the model's
    folder, where slime's functions load tokenizers from), bound to ``runtime``. ``config`` stays as built."""
    parsed = urlparse(url)
    learned: dict[str, Any] = {"sglang_router_ip": parsed.hostname, "sglang_router_port": parsed.port}
    if not config.hf_checkpoint and model_path:
        learned["hf_checkpoint"] = str(model_path)
    view = config.replace(**learned)
    bind_runtime(view, runtime)
    return view


def load_tokenizer(args: RolloutConfig) -> Any:
    checkpoint = args.hf_checkpoint or args.model
    if not checkpoint:
        raise ValueError(
            "the engine has no tokenizer: pass --hf-checkpoint with the model's tokenizer folder"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


def close_runtime(runtime: Runtime) -> None:
    try:
        for server in filter(None, [runtime.server, *runtime.servers]):
            runtime.run(server.close())
        runtime.run(runtime.engine.close())
    finally:
        runtime.loop.close()


@contextmanager
def running(args: RolloutConfig, pm: RlsdkPluginManager | None = None) -> Iterator[Runtime]:
    """Resolve the run's plugins, then start the engine; close everything on the way out."""
    plugins = resolve_run_plugins(args, pm)
    with ExitStack() as stack:
        if args.ray_address:  # engines, trainer and grading as Ray actors and tasks
            stack.enter_context(on_ray(args, plugins))
        runtime = open_runtime(args, plugins)
        try:
            with tuned_garbage_collector():
                yield runtime
        finally:
            close_runtime(runtime)
