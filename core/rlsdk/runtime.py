"""The runtime of a run: its resolved plugins, engine and tokenizer, reachable from ``args``.

Plugin call signatures are slime's, so a ``generate_rollout`` or ``custom_generate`` gets only
``args``; :func:`get_runtime` (public: ``rlsdk.get_runtime``) hands it the runtime of the run in progress.
Core passes the runtime explicitly; the accessor is for plugins. When nothing was bound (a function called
by slime, say), one is built from ``args``: an SGLang client for ``args.sglang_router_ip``/
``args.sglang_router_port``, the tokenizer of ``args.hf_checkpoint`` and the installed plugins.
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
import concurrent.futures
import gc
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .aio.stopping import StopRequest
from .engines.engine import InferenceEngine
from .config import installed_plugin_manager as installed_plugins
from .plugins.manager import RlsdkPluginManager, get_plugin_manager
from .plugins.run_plugins import RunPlugins
from .config import RolloutConfig

_ATTR = "_rlsdk_runtime"
T = TypeVar("T")


SIGNAL_POLL_SECONDS = 0.2
"""How often a thread waiting for the loop wakes up, so that signal handlers run (see :meth:`BackgroundLoop.run`)."""
YOUNG_COLLECTION_THRESHOLD = 20_000
"""Allocations between young collections while a run is on (Python's default is 700)."""


@contextmanager
def tuned_garbage_collector() -> Iterator[None]:
    """The garbage collector for a run or a server, until the block ends.

    The objects alive on entry (modules, the model, the data) are frozen out of the collector's sight:
    a full collection otherwise walks all of them, about 0.2 s in a process with transformers loaded,
    and the engine's steps and the event loop stand still while it runs. Young collections run every
    :data:`YOUNG_COLLECTION_THRESHOLD` allocations instead of 700, so that the objects of one decode step
    or one response are mostly gone before a collection walks them: on an H100 this took the collector's
    share of a ``rlsdk run`` step from 1-2% to under 1%."""
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], YOUNG_COLLECTION_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


class BackgroundLoop:
    """An asyncio loop in a daemon thread: engines and servers live there, and sync plugin calls
    (slime's ``generate_rollout`` is sync) submit coroutines to it."""

    def __init__(self, name: str = "rlsdk-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result, at most ``timeout`` seconds (not callable
        from the loop itself)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BackgroundLoop.run called from its own loop: await the coroutine instead")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if timeout is None:
            # Wake up now and then: a signal the kernel hands to another thread runs its Python handler
            # only once the main thread runs again (a graceful stop must not wait for the whole step).
            while not concurrent.futures.wait([future], timeout=SIGNAL_POLL_SECONDS).done:
                pass
        return future.result(timeout)

    def close(self) -> None:
        """Cancel the tasks still running (after Ctrl-C, the step's), let them unwind, then stop: a loop
        stopped under pending tasks prints "Task was destroyed but it is pending!" for each."""
        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout=10)
            except (TimeoutError, RuntimeError):
                pass  # tasks that will not unwind: stop anyway
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


@dataclass
class Runtime:
    """What plugins of one run share."""

    pm: RlsdkPluginManager
    engine: InferenceEngine
    tokenizer: Any = None
    loop: BackgroundLoop = field(default_factory=BackgroundLoop)
    """The loop the engine lives on; sync callers run coroutines there with :meth:`run`."""
    state: dict[str, Any] = field(default_factory=dict)
    """Per-run scratch space for plugins (caches, clients), keyed by the plugin's name. Core keeps
    nothing here."""
    progress: Callable[[int], None] | None = None
    """Called with a sample count as groups finish, for progress bars."""
    server: Any = None
    """The run's loopback server for an engine without a URL of its own (``/generate`` and the chat
    endpoint), or None."""
    servers: list[Any] = field(default_factory=list)
    """Other servers started for the run (an agent's chat endpoint), closed with it."""
    on_state_saved: list[Callable[[dict[str, Any]], None]] | None = None
    """Under ``rlsdk run``: callables run with each run state once it is on disk (a rollout that took data
    from a service acknowledges it only when a saved state covers its step); None elsewhere."""
    saved_state: dict[str, Any] | None = None
    """Under ``rlsdk run``: the last run state on disk (``next_rollout_id`` is the first step it does not
    cover); None elsewhere."""
    run_plugins: RunPlugins | None = None
    """The run's plugins, resolved once; made from ``pm`` for the ``args`` the runtime is bound to when
    not given."""
    args: RolloutConfig | None = None
    """The run's configuration as its plugins see it (:func:`rlsdk.run.session.run_args`: what the runtime
    learned, the engine's address and the model's folder, under slime's names), bound to this runtime."""
    stop: StopRequest = field(default_factory=StopRequest)
    """Set when the run is asked to stop gracefully (SIGTERM, SIGINT): a rollout step then aborts what is in
    flight and returns every group to the buffer, tokens kept, and the run checkpoints and stops."""

    @property
    def plugins(self) -> RunPlugins:
        """The run's plugins (:class:`rlsdk.plugins.run_plugins.RunPlugins`): every kind resolved once."""
        if self.run_plugins is None:
            raise RuntimeError("the runtime is not bound to a run's args yet (rlsdk.runtime.bind_runtime)")
        return self.run_plugins

    def __deepcopy__(self, memo: dict[int, Any]) -> Runtime:
        """A copy of ``args`` (slime's examples ``deepcopy(args)``) belongs to the same run."""
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """Pickled ``args`` (sent to another process) carry no runtime: there, :func:`get_runtime` builds
        one from the engine's URL."""
        return _no_runtime, ()

    def report_progress(self, samples: int) -> None:
        if self.progress is not None:
            self.progress(samples)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)


def _no_runtime() -> None:
    return None


def bind_runtime(args: RolloutConfig | Namespace, runtime: Runtime) -> Runtime:
    """Attach ``runtime`` to ``args`` so every plugin of the run finds it."""
    if runtime.run_plugins is None:
        runtime.run_plugins = RunPlugins(args, runtime.pm)
    object.__setattr__(args, _ATTR, runtime)
    return runtime


_outside_a_run: dict[int, tuple[weakref.ref[Any], RunPlugins]] = {}


def _forgetting(key: int) -> Callable[[Any], None]:
    """A weak reference's callback dropping ``key`` from the plugins made outside a run (the dict is held,
    not looked up: at interpreter exit the module's names may be gone already)."""
    cache = _outside_a_run

    def forget(_: Any) -> None:
        cache.pop(key, None)

    return forget


def plugins_of(args: RolloutConfig) -> RunPlugins:
    """The plugins of the run bound to ``args`` (its runtime's, made once for the run); outside a run (a Ray
    trainer actor, a script scoring samples, slime calling an rlsdk plugin) the installed plugins for
    ``args``, made once per ``args`` object."""
    runtime = getattr(args, "__dict__", {}).get(_ATTR)
    if runtime is not None:
        return runtime.plugins
    key = id(args)
    found = _outside_a_run.get(key)
    if found is None or found[0]() is not args:
        found = (
            weakref.ref(args, _forgetting(key)),
            RunPlugins(args, installed_plugins()),
        )
        _outside_a_run[key] = found
    return found[1]


def get_runtime(args: RolloutConfig | Namespace) -> Runtime:
    """The runtime bound to ``args``, or one built from ``args`` for an SGLang endpoint."""
    runtime = getattr(args, "__dict__", {}).get(_ATTR)
    if runtime is not None:
        return runtime
    from .engines.sglang_client import SGLangClient  # aiohttp: loaded only where a client is made

    host, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not host or not port:
        raise RuntimeError(
            "no engine: run under `rlsdk run`, or set args.sglang_router_ip and args.sglang_router_port"
        )
    tokenizer = None
    checkpoint = getattr(args, "hf_checkpoint", None)
    if checkpoint:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return bind_runtime(args, Runtime(get_plugin_manager(), SGLangClient(f"http://{host}:{port}"), tokenizer))
