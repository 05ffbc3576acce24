"""The Ray wiring of a run (``rlsdk run --ray``): the cluster joined, every node's plugins checked, the
engine and trainer built as actors, grading sent to Ray tasks (:mod:`rlsdk.ray` holds the actors)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config import RolloutConfig
from ..aio.task_pools import set_cluster_task_pool
from ..plugins.run_plugins import RunPlugins
from ..ray.cluster import LOCAL, connect
from ..ray.engine_actor import engine_count, local_cpus
from ..ray.engine_pool import RayEnginePool
from ..ray.environments import check_nodes
from ..ray.task_pool import RayTaskPool, score_on_cluster
from ..ray.trainer_actor import RemoteTrainer, TrainerLaunch, launch_trainer
from ..plugins.kinds import Engine, Trainer


def _import_tokenizers() -> None:
    """Import transformers' tokenizers (torch with them), which the driver loads its tokenizer with once
    the engines are up (the engine pool has none of its own): here, while the driver waits for the actors
    to start, rather than after."""
    try:
        from transformers import AutoTokenizer  # noqa: F401
    except ImportError:  # the run then fails where it loads the tokenizer, with its own error
        pass


@contextmanager
def on_ray(args: RolloutConfig, plugins: RunPlugins) -> Iterator[None]:
    """Connect to (or start) the run's cluster, check every node's plugins, and have ``plugins`` build the
    engine and trainer as Ray actors; grading goes to Ray tasks until the block ends."""
    engine_count(args)  # engine counts that disagree stop the run before Ray starts
    cluster = connect(args, local_cpus(args))
    threading.Thread(target=_import_tokenizers, name="rlsdk-imports", daemon=True).start()
    launched: list[TrainerLaunch] = []
    pools: list[RayEnginePool] = []
    try:
        driver = plugins.pm.plugin_versions()
        if cluster.address != LOCAL:  # a local cluster's one node is checked by its first actor's start
            check_nodes(driver, args.ray_start_timeout)
        set_cluster_task_pool(RayTaskPool())
        engine_spec = Engine.chosen(args)
        training = bool(args.train)

        def engine_pool(a: Any) -> RayEnginePool:
            pools.append(RayEnginePool(a, engine_spec, driver, standbys_at_start=not training))
            return pools[-1]

        def remote_trainer(a: Any) -> RemoteTrainer:
            trainer = RemoteTrainer(a, a.trainer, driver, launched[0])
            for pool in pools:  # the run is ready for its first step: standbys no longer slow its start
                pool.prepare_standbys()
            return trainer

        plugins.swap(Engine, engine_pool)
        if training:  # launched now, so that it starts while the engines start
            launched.append(launch_trainer(args))
            plugins.swap(Trainer, remote_trainer)
        if args.ray_sync_rewards:  # sync rewards as Ray tasks
            plugins.reward_runner = score_on_cluster
        yield
    finally:
        plugins.reward_runner = None
        set_cluster_task_pool(None)
        for launch in launched:
            launch.kill()
        cluster.close()
