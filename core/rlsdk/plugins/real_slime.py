"""slime's functions under rlsdk *with* slime installed: they check ``isinstance(sample, slime's Sample)``,
so a function given by path gets slime's own samples, converted from rlsdk's on the way in and back on
the way out (what it returns, and what it leaves in a buffer it filters). Without a real slime the
stand-ins make slime's classes rlsdk's and nothing is wrapped."""

from __future__ import annotations

from argparse import Namespace
import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from ..engines.run_tokens import auth_headers
from ..types import Sample
from .slime_layer import real_slime_importable


def slime_sample_class() -> Any:
    """slime's own ``Sample`` when a real slime is importable, else None."""
    if not real_slime_importable():
        return None
    try:
        cls = importlib.import_module("slime.utils.types").Sample
    except ImportError:
        return None
    return None if cls is Sample else cls


class _Converter:
    """rlsdk's samples to slime's and back, remembering which is which so identities survive."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.originals: dict[int, Sample] = {}

    def out(self, sample: Any) -> Any:
        if not isinstance(sample, Sample):
            return sample
        converted = self.cls.from_dict(sample.to_dict())
        self.originals[id(converted)] = sample
        return converted

    def back(self, sample: Any) -> Any:
        if isinstance(sample, Sample):
            return sample
        original = self.originals.get(id(sample))
        data = sample.to_dict()
        fresh = Sample.from_dict(data)
        if original is None:
            return fresh
        # what the slime function changed, on rlsdk's own object (fields slime's Sample lacks are kept)
        original.__dict__.update({key: vars(fresh)[key] for key in data if key in vars(fresh)})
        return original

    def groups_out(self, groups: list[list[Any]]) -> list[list[Any]]:
        return [[self.out(s) for s in g] for g in groups]

    def groups_back(self, groups: list[list[Any]]) -> list[list[Any]]:
        return [[self.back(s) for s in g] for g in groups]


def init_slime_http_client(args: Namespace) -> None:
    """slime's ``post`` needs its client, which slime's trainer makes at start-up: make it (once)."""
    try:
        http_utils = importlib.import_module("slime.utils.http_utils")
    except ImportError:  # a slime without it has no client to make
        return
    if getattr(http_utils, "_http_client", True) is None:
        http_utils.init_http_client(args)
    client = getattr(http_utils, "_http_client", None)
    host, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if client is not None and host and port:  # slime posts to the run's engine server: its secret
        client.headers.update(auth_headers(f"http://{host}:{port}"))


def for_real_slime(kind: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a slime function loaded by path) taking and giving slime's samples when slime is
    installed; ``func`` itself otherwise, or for kinds whose arguments hold no samples."""
    cls = slime_sample_class()
    wrap = _WRAPPERS.get(kind)
    if cls is None or wrap is None:
        return func
    wrapped = wrap(func, cls)
    functools.update_wrapper(wrapped, func)
    wrapped.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
    return wrapped


def _reward(func: Callable[..., Any], cls: type) -> Callable[..., Any]:
    def converted(target: Any) -> Any:
        c = _Converter(cls)
        return [c.out(s) for s in target] if isinstance(target, list) else c.out(target)

    if not inspect.iscoroutinefunction(func):  # stays sync: rlsdk runs it in a thread

        def sync_reward(args: Namespace, target: Any, **kwargs: Any) -> Any:
            return func(args, converted(target), **kwargs)

        return sync_reward

    async def reward(args: Namespace, target: Any, **kwargs: Any) -> Any:
        return await func(args, converted(target), **kwargs)

    return reward


def _custom_generate(func: Callable[..., Any], cls: type) -> Callable[..., Any]:
    async def custom_generate(args: Namespace, sample: Any, sampling_params: Any, **kwargs: Any) -> Any:
        init_slime_http_client(args)
        c = _Converter(cls)
        result = func(args, c.out(sample), sampling_params, **kwargs)
        result = await result if inspect.isawaitable(result) else result
        return [c.back(s) for s in result] if isinstance(result, list) else c.back(result)

    return custom_generate


def _dynamic_filter(func: Callable[..., Any], cls: type) -> Callable[..., Any]:
    def dynamic_filter(args: Namespace, samples: list[Any], **kwargs: Any) -> Any:
        return func(args, [_Converter(cls).out(s) for s in samples], **kwargs)

    return dynamic_filter


def _over_sampling_filter(func: Callable[..., Any], cls: type) -> Callable[..., Any]:
    def over_sampling_filter(args: Namespace, groups: list[list[Any]], **kwargs: Any) -> Any:
        c = _Converter(cls)
        return c.groups_back(func(args, c.groups_out(groups), **kwargs))

    return over_sampling_filter


def _buffer_filter(func: Callable[..., Any], cls: type) -> Callable[..., Any]:
    def buffer_filter(args: Namespace, rollout_id: Any, buffer: list[list[Any]], num_samples: int) -> Any:
        c = _Converter(cls)
        theirs = c.groups_out(buffer)
        taken = func(args, rollout_id, theirs, num_samples)
        buffer[:] = c.groups_back(theirs)  # the filter removes what it takes from the buffer
        return c.groups_back(taken)

    return buffer_filter


_WRAPPERS: dict[str, Callable[[Callable[..., Any], type], Callable[..., Any]]] = {
    "reward": _reward,
    "custom_generate": _custom_generate,
    "dynamic_filter": _dynamic_filter,
    "over_sampling_filter": _over_sampling_filter,
    "buffer_filter": _buffer_filter,
}
