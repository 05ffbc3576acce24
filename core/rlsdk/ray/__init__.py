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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..aio.task_pools import set_cluster_task_pool
from ..plugins.manager import RlsdkPluginManager
from ..plugins.records import Resolved


def _with_factory(resolved: Resolved, factory: Any) -> Resolved:
    return dataclasses.replace(resolved, record=dataclasses.replace(resolved.record, func=factory))


@contextmanager
def on_ray(args: Any, pm: RlsdkPluginManager, plugins: dict[str, Resolved]) -> Iterator[dict[str, Resolved]]:
    """Connect to (or start) the run's cluster, check every node's plugins, and give back ``plugins``
    with the engine and trainer built as Ray actors; grading goes to Ray tasks until the block ends."""
    from ..rollout.job import engine_name, plugin_versions
    from .cluster import connect
    from .engine_actor import engine_count
    from .engine_pool import RayEnginePool
    from .environments import check_nodes
    from .task_pool import RayTaskPool
    from .trainer_actor import RemoteTrainer, TrainerLaunch, launch_trainer

    engine_count(args)  # engine counts that disagree stop the run before Ray starts
    cluster = connect(args)
    launched: list[TrainerLaunch] = []
    try:
        driver = plugin_versions(pm)
        check_nodes(driver, args.ray_start_timeout)
        set_cluster_task_pool(RayTaskPool())
        engine_spec = engine_name(args)
        swapped = {
            **plugins,
            "engine": _with_factory(plugins["engine"], lambda a: RayEnginePool(a, engine_spec, driver)),
        }

        if "trainer" in plugins:  # launched now, so that it starts while the engines start
            launched.append(launch_trainer(args))
            swapped["trainer"] = _with_factory(
                plugins["trainer"], lambda a: RemoteTrainer(a, a.trainer, driver, launched[0])
            )
        yield swapped
    finally:
        set_cluster_task_pool(None)
        for launch in launched:
            launch.kill()
        cluster.close()
