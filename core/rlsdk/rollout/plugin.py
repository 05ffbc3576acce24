"""Core's own rollout plugins, registered through core's ``rollout`` entry point like any other (as conda
and llm do):
the ``sglang`` rollout, the ``single_turn`` generator, the ``sglang`` engine (the SGLang-protocol client) and
the ``pop_first`` buffer filter. With them and the ``torch`` trainer, rlsdk runs against any SGLang-protocol
server, and tests, without a plugin package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plugins.hookspecs import hookimpl
from ..data import DataSource
from ..plugins.kinds import BufferFilter, CustomGenerate, DataSourceFactory, Engine, GenerateRollout
from ..plugins.run_plugins import sglang_url
from . import generate, step
from ..config import RolloutConfig


def sglang_engine(args: RolloutConfig) -> Any:
    """A real SGLang server or router by URL; without one, rlsdk launches SGLang servers (and a router)
    on this machine's GPUs for ``--hf-checkpoint`` (:mod:`rlsdk.engines.launch.sglang`)."""
    from ..engines.sglang_client import SGLangClient

    url = sglang_url(args)
    launcher = None
    if not url:
        from ..engines.launch.sglang import launcher_for

        launcher = launcher_for(args, Path(args.output_dir) / "logs")
        url = launcher.url
    return SGLangClient(
        url,
        concurrency=args.sglang_server_concurrency,
        retries=args.sglang_retries,
        backoff=args.sglang_backoff,
        launcher=launcher,
    )


def pop_first(
    args: RolloutConfig, rollout_id: int, buffer: list[list[Any]], num_samples: int
) -> list[list[Any]]:
    """Serve the oldest groups first (FIFO), removing them from the buffer.

    Example: a buffer ``[g0, g1, g2]`` asked for 2 serves ``[g0, g1]`` and keeps ``[g2]``.
    """
    taken = buffer[: max(num_samples, 0)]
    del buffer[: len(taken)]
    return taken


@hookimpl
def rlsdk_generate_rollouts() -> Any:
    yield GenerateRollout(
        name="sglang",
        func=step.generate_rollout,
        description="Over-sampling rollout with dynamic filter, abort and partial rollouts",
    )


@hookimpl
def rlsdk_custom_generates() -> Any:
    yield CustomGenerate(
        name="single_turn",
        func=generate.generate,
        description="One /generate call through the run's engine (the default)",
    )


@hookimpl
def rlsdk_engines() -> Any:
    yield Engine(name="sglang", func=sglang_engine, launches=lambda args: sglang_url(args) is None)


@hookimpl
def rlsdk_buffer_filters() -> Any:
    yield BufferFilter(name="pop_first", func=pop_first)


@hookimpl
def rlsdk_data_sources() -> Any:
    yield DataSourceFactory(
        name="prompt_data",
        func=DataSource,
        description="Prompts from prompt_data (JSONL or Parquet) with a buffer served first (the default)",
    )
