"""rlsdk on Ray (``rlsdk run --ray``, ``pip install 'rlsdk[ray]'``): engines, the trainer and CPU-heavy
grading as Ray actors and tasks, for runs that outgrow one machine or one engine.

The run's loop does not change: :func:`on_ray` swaps the resolved engine for a pool of engine actors
(:mod:`.engine_pool`), the trainer for a trainer actor (:mod:`.trainer_actor`), and installs Ray tasks as
the cluster's pool for CPU-heavy grading (:mod:`.task_pool`). Every worker resolves plugin names from its
own environment, and each node's plugins are checked against the driver's before the first step
(:mod:`.environments`). Nothing here imports Ray until a run asks for it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..aio.task_pools import set_cluster_task_pool
from ..plugins.manager import RlsdkPluginManager
from ..plugins.records import Resolved


def _import_tokenizers() -> None:
    """Import transformers' tokenizers (torch with them), which the driver loads its tokenizer with once
    the engines are up (the engine pool has none of its own): here, while the driver waits for the actors
    to start, rather than after."""
    try:
        from transformers import AutoTokenizer  # noqa: F401
    except ImportError:  # the run then fails where it loads the tokenizer, with its own error
        pass


def _with_factory(resolved: Resolved, factory: Any) -> Resolved:
    return dataclasses.replace(resolved, record=dataclasses.replace(resolved.record, func=factory))


@contextmanager
def on_ray(args: Any, pm: RlsdkPluginManager, plugins: dict[str, Resolved]) -> Iterator[dict[str, Resolved]]:
    """Connect to (or start) the run's cluster, check every node's plugins, and give back ``plugins``
    with the engine and trainer built as Ray actors; grading goes to Ray tasks until the block ends."""
    from ..rollout.job import engine_name, plugin_versions
    from .cluster import LOCAL, connect
    from .engine_actor import engine_count
    from .engine_pool import RayEnginePool
    from .environments import check_nodes
    from .task_pool import RayTaskPool
    from .trainer_actor import RemoteTrainer, TrainerLaunch, launch_trainer

    engine_count(args)  # engine counts that disagree stop the run before Ray starts
    cluster = connect(args)
    threading.Thread(target=_import_tokenizers, name="rlsdk-imports", daemon=True).start()
    launched: list[TrainerLaunch] = []
    pools: list[RayEnginePool] = []
    try:
        driver = plugin_versions(pm)
        if cluster.address != LOCAL:  # a local cluster's one node is checked by its first actor's start
            check_nodes(driver, args.ray_start_timeout)
        set_cluster_task_pool(RayTaskPool())
        engine_spec = engine_name(args)
        training = "trainer" in plugins

        def engine_pool(a: Any) -> RayEnginePool:
            pools.append(RayEnginePool(a, engine_spec, driver, standbys_at_start=not training))
            return pools[-1]

        def remote_trainer(a: Any) -> RemoteTrainer:
            trainer = RemoteTrainer(a, a.trainer, driver, launched[0])
            for pool in pools:  # the run is ready for its first step: standbys no longer slow its start
                pool.prepare_standbys()
            return trainer

        swapped = {**plugins, "engine": _with_factory(plugins["engine"], engine_pool)}
        if training:  # launched now, so that it starts while the engines start
            launched.append(launch_trainer(args))
            swapped["trainer"] = _with_factory(plugins["trainer"], remote_trainer)
        yield swapped
    finally:
        set_cluster_task_pool(None)
        for launch in launched:
            launch.kill()
        cluster.close()
