"""The hook implementations that register the ``vllm`` engine and its options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlsdk import Engine, Option, hookimpl


def vllm_engine(args: Any) -> Any:
    """vLLM 0.26: the server at ``--vllm-url``, or one rlsdk launches from ``--vllm-python`` for
    ``--hf-checkpoint``. ``rlsdk run`` has refused what vLLM cannot do before (:func:`refuse_unsupported`);
    the settings' own refusals hold here too, for callers that build the engine directly."""
    from .client import VLLMClient

    refuse_settings(args)
    options = {
        "concurrency": args.vllm_server_concurrency,
        "retries": args.vllm_retries,
    }
    if not launches(args):
        return VLLMClient(args.vllm_url, **options)
    from .launch import VLLMLauncher

    launcher = VLLMLauncher(args, Path(args.output_dir) / "logs")
    return VLLMClient(socket=launcher.socket, launcher=launcher, **options)


def launches(args: Any) -> bool:
    """Whether the engine starts vLLM itself (no ``--vllm-url``)."""
    return not args.vllm_url


def refuse_unsupported(args: Any) -> None:
    """A ValueError with a one-line reason for what this run asks of vLLM that it cannot do (``rlsdk run``
    calls it before anything starts): :func:`refuse_settings`, and what a launched server cannot be given
    (:func:`.launch.check_launch`: its model, flags, LoRA rank, GPUs and ``--vllm-python``)."""
    from .launch import check_launch

    refuse_settings(args)
    if launches(args):
        check_launch(args)


def refuse_settings(args: Any) -> None:
    """What vLLM cannot do with these settings, whether launched or given by URL."""
    from .launch import weight_transfer

    tensor_parallel = args.rollout_num_gpus_per_engine
    if weight_transfer(args) == "ipc" and tensor_parallel != 1:
        raise ValueError(
            f"vllm engine: colocated CUDA-IPC sync with tensor parallel {tensor_parallel}: vLLM's IPC backend "
            "finds each worker's tensors by its GPU and the trainer sends from one; use --weight-sync nccl "
            "or disk, or --rollout-num-gpus-per-engine 1"
        )


@hookimpl
def rlsdk_engines():
    yield Engine(
        name="vllm",
        func=vllm_engine,
        description="vLLM 0.26, launched from --vllm-python or by --vllm-url",
        check=refuse_unsupported,
        launches=launches,
    )


@hookimpl
def rlsdk_options():
    yield Option(
        "vllm_url",
        str,
        help="A running vLLM 0.26 server for --engine vllm (started with VLLM_SERVER_DEV_MODE=1: the RL routes); "
        "without it rlsdk launches one.",
    )
    yield Option(
        "vllm_python",
        str,
        help="The Python interpreter of vLLM's own environment (vllm 0.26 installed), which launches the "
        "server; default this one.",
    )
    yield Option(
        "vllm_args",
        str,
        help='More `vllm serve` flags for a launched server, as one string ("--gpu-memory-utilization 0.7 '
        '--max-model-len 4096"); flags rlsdk sets itself are refused with the option to use.',
    )
    yield Option(
        "vllm_startup_timeout",
        float,
        900.0,
        help="Seconds a launched vLLM server may take to answer /health.",
    )
    yield Option(
        "vllm_server_concurrency",
        int,
        512,
        help="Requests the vllm engine's client keeps in flight at most.",
    )
    yield Option(
        "vllm_retries",
        int,
        5,
        help="Times the vllm engine's client retries a request that met a connection error or an HTTP 5xx.",
    )
