"""What the training options mean together: their choices, defaults shared with the code that applies them,
and the questions several options answer (is this run asynchronous, offloaded, how many trainer ranks).
The options themselves are the sections of :mod:`rlsdk.options`."""

from __future__ import annotations

import re
from pathlib import Path
from .options import RunOptions


def stale_samples(args: RunOptions) -> bool:
    """Whether the trainer may take samples an older policy generated (``--async`` or a lag above 0)."""
    return bool(args.train_async or args.max_policy_version_lag)


def tis_on(args: RunOptions) -> bool:
    """Whether the policy loss applies truncated importance sampling: ``use_tis``, or when unset, whether
    samples can be stale (and the ratio is not already taken against the engine's log-probs)."""
    if args.use_tis is not None:
        return bool(args.use_tis)
    return stale_samples(args) and not args.use_rollout_logprobs


def overlapped(args: RunOptions) -> bool:
    """Whether rollouts overlap training (``--async`` or ``--max-policy-version-lag``)."""
    return bool(args.train_async) or args.max_policy_version_lag is not None


def trainer_world_size(args: RunOptions) -> int:
    """The trainer's processes (one per GPU): ``actor_num_gpus_per_node``, default TP x PP x EP."""
    return args.actor_num_gpus_per_node or (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.expert_model_parallel_size
    )


def offloads(args: RunOptions) -> tuple[bool, bool]:
    """``(offload_train, offload_rollout)``: each as set, else on with ``offload`` or ``colocate``."""
    default = bool(getattr(args, "offload", False) or getattr(args, "colocate", False))
    train, rollout = getattr(args, "offload_train", None), getattr(args, "offload_rollout", None)
    return (default if train is None else train), (default if rollout is None else rollout)


def named_model_folder(args: RunOptions) -> Path | None:
    """The model folder the command line names, before any engine starts: ``hf_checkpoint``, else ``model``
    where it is a folder (not a name the engine resolves); None otherwise."""
    return next((Path(f) for f in (args.hf_checkpoint, args.model) if f and Path(f).is_dir()), None)


def option_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), for ``--help``."""
    import ast
    import inspect
    import itertools
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field_node, doc in itertools.pairwise(body):
        if (
            isinstance(field_node, ast.AnnAssign)
            and isinstance(field_node.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
        ):
            text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", str(doc.value.value))  # Sphinx roles read as code
            docs[field_node.target.id] = " ".join(text.replace("``", "`").split())
    return docs
