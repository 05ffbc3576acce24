"""Every worker resolves plugin names from its own environment: before the first step, each node's (and
each engine actor's) installed plugins are checked against the driver's. A local cluster's one node is
checked by its first engine actor's start, with no probe task of its own (:func:`rlsdk.ray.on_ray`)."""

from __future__ import annotations

from typing import Any

from ..errors import RlsdkError
from .cluster import import_ray, worker_info


class PluginEnvironmentError(RlsdkError):
    """A worker's plugins differ from the driver's: one is missing or at another version."""


def differences(driver: dict[str, str | None], worker: dict[str, str | None]) -> list[str]:
    """One line per distribution installed differently on the worker than on the driver."""
    lines = []
    for name in sorted(set(driver) | set(worker)):
        here, there = driver.get(name), worker.get(name)
        if name not in worker:
            lines.append(f"{name} {here} is installed on the driver but missing on the worker")
        elif name not in driver:
            lines.append(f"{name} {there} is installed on the worker but not on the driver")
        elif here != there:
            lines.append(f"{name} is {here} on the driver but {there} on the worker")
    return lines


def check_worker(what: str, info: dict[str, Any], driver: dict[str, str | None]) -> None:
    """Raise :class:`PluginEnvironmentError` naming the node and each distribution that differs."""
    lines = differences(driver, info["plugins"])
    if lines:
        raise PluginEnvironmentError(
            f"{what} on node {info['node']} (pid {info['pid']}, log {info['log_file']}) has other plugins "
            f"than the driver: {'; '.join(lines)}. Install the same versions on every node (or pass them "
            "with --runtime-env) before the run starts"
        )


def check_nodes(driver: dict[str, str | None], timeout: float) -> list[dict[str, Any]]:
    """Run :func:`worker_info` as a task on every alive node and check each against the driver's plugins;
    returns the nodes' infos."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(worker_info)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
        for node in nodes
    ]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        late = [nodes[refs.index(ref)]["NodeManagerAddress"] for ref in pending]
        raise PluginEnvironmentError(
            f"the nodes {', '.join(late)} did not run a worker within {timeout:g}s "
            "(ray_start_timeout) to report their plugins"
        )
    infos = ray.get(refs)
    for info in infos:
        check_worker("a worker", info, driver)
    return infos
