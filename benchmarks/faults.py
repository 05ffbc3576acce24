"""Engines SIGKILLed during a training run on a local Ray cluster: is anything lost, how long is each engine
gone, and what does Ray's start-up add to ``rlsdk run``.

A ``rlsdk run --train --ray --num-engines 2`` (the embedded engine on SmolLM2-135M, or ``--tiny`` a
2-layer random Llama) runs ``--steps`` steps while a killer thread SIGKILLs the process of a random engine
``--kills`` times, each at a random moment while it has requests in flight (after the previous engine
rejoined); ``--spares 1`` keeps a started engine ready to take a dead one's place, ``--standbys``
(default 1, the run's default) prepared actors with no model loaded. Reported:

- ``samples_lost``: samples the data source handed out that are neither kept, discarded nor in the buffer
  at the end (:func:`rlsdk.rollout.ledger.audit_run`). Must be 0.
- ``steps_completed`` and the samples the kills sent back to the buffer (``returned``).
- ``recovery_seconds`` per kill: from the SIGKILL until the restarted engine, given the current weights and
  past the trust check, took requests again. Target: at most 10 s on 2 CPU cores. ``recoveries`` breaks
  each down: what took the dead engine's place (``spare``, ``standby``, ``new``) and the seconds from the
  SIGKILL at which it was detected and its replacement got past each stage (``created``: Ray started its
  process and built the actor; ``prepared``: the engine's imports done; ``started``: model loaded;
  ``weights``: current weights taken; ``trusted``: past the trust check).
- ``startup``: wall time of the same 1-step ``rlsdk run`` (on CPU) in a fresh process without Ray and
  with ``--ray`` (one engine), and the difference: what Ray's start-up adds on one machine.

    python benchmarks/faults.py [--kills 3] [--steps 8] [--spares 0] [--standbys 1] [--tiny]
                                [--no-startup | --startup-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TARGET_RECOVERY_S = 10.0


def tiny_model(folder: Path) -> Path:
    """A 2-layer Llama with random weights and a 32-word tokenizer (as the tests' ``tiny_llama``)."""
    from rlsdk.testing import tiny_llama

    return tiny_llama(folder)


def run_options(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The run's options: the shipped arithmetic data on SmolLM2, or word prompts on the tiny model."""
    options: dict[str, Any] = {
        "train": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "lr": 1e-5,
        "rollout_max_response_len": 24,
        "engine_threads": 1,
        "train_threads": 1,
        "rollout_shuffle": True,
        "eval_interval": None,
    }
    if opts.tiny:
        data = work / "prompts.jsonl"
        data.write_text("".join(json.dumps({"input": f"w{i % 28} w{i % 28 + 1}"}) + "\n" for i in range(64)))
        options.update(model=str(tiny_model(work / "tiny")), prompt_data=str(data), rm_type="random", lr=1e-2)
    return options


class Killer(threading.Thread):
    """SIGKILLs a random engine with requests in flight ``kills`` times, from the second step on (so that
    each replacement takes weights synced by the trainer and their trust check), each a random 0.5-3 s
    after the pool is back at full strength (every engine up again, and its spares and standbys ready);
    records the kill times."""

    def __init__(self, args: Any, kills: int, seed: int) -> None:
        super().__init__(name="killer", daemon=True)
        self.args, self.kills, self.random = args, kills, random.Random(seed)
        self.done = threading.Event()
        self.first_step = threading.Event()
        self.killed_at: list[float] = []
        self.pool: Any = None

    def run(self) -> None:
        while self.pool is None and not self.done.wait(0.1):
            runtime = vars(self.args).get("_rlsdk_runtime")  # bound once the engines are up
            self.pool = runtime.engine if runtime else None
        while not self.first_step.wait(0.1) and not self.done.is_set():
            pass
        while len(self.killed_at) < self.kills and not self.done.wait(self.random.uniform(0.5, 3.0)):
            busy = self.wait_for(
                lambda: self.pool.at_full_strength and [r for r in self.pool.replicas_ if r.in_flight],
                0.02,
            )
            if not busy:
                return
            victim = self.random.choice(busy)
            self.killed_at.append(time.time())
            print(
                f"killing engine {victim.index} (pid {victim.info['pid']}, {victim.in_flight} requests)",
                file=sys.stderr,
            )
            recoveries = len(self.pool.recoveries)
            os.kill(victim.info["pid"], signal.SIGKILL)
            self.wait_for(lambda n=recoveries: len(self.pool.recoveries) > n, 0.02)  # noticed
            self.wait_for(lambda: self.pool.recoveries[-1].rejoined_at, 0.1)  # and back

    def wait_for(self, condition: Any, every: float) -> Any:
        """The first true value of ``condition()``, polled every ``every`` seconds; None once the run ended."""
        while not self.done.wait(every):
            value = condition()
            if value:
                return value
        return None


def faults(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    from rlsdk import RolloutConfig

    out = work / "faults"
    options = run_options(opts, work)
    args = RolloutConfig(
        **options,
        num_rollout=opts.steps,
        output_dir=str(out),
        ray_address="local",
        num_engines=2,
        ray_spare_engines=opts.spares,
        ray_standby_engines=opts.standbys,
    ).with_default_data(given={*options, "num_rollout"})

    def on_step(rollout_id: int, metrics: dict[str, Any], killer: Killer) -> None:
        print(
            f"step {rollout_id}: returned {metrics['ledger/returned']}, kept {metrics['ledger/kept']}",
            file=sys.stderr,
        )

    report, _ = run_with_killer(args, opts.kills, opts.seed, out, on_step)
    return report


def run_with_killer(
    args: Any, kills: int, seed: int, out: Path, on_step: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``run_job(args)`` while a :class:`Killer` SIGKILLs ``kills`` engines; ``on_step(rollout_id, metrics,
    killer)`` after each step. Returns the kills' report (the output folder's ledger audit, detection and
    recovery seconds by stage) and every step's metrics."""
    from rlsdk.run.job import run_job
    from rlsdk.rollout.ledger import audit_run

    killer = Killer(args, kills, seed)
    killer.start()
    steps: list[dict[str, Any]] = []

    def record(rollout_id: int, metrics: dict[str, Any]) -> None:
        steps.append(metrics)
        killer.first_step.set()
        on_step(rollout_id, metrics, killer)

    started = time.perf_counter()
    try:
        run_job(args, on_step=record)
    finally:
        killer.done.set()
    audit = audit_run(out)
    recoveries = killer.pool.recoveries if killer.pool is not None else []
    killed = list(zip(recoveries, killer.killed_at, strict=False))
    report = {
        "kills": len(killer.killed_at),
        "samples_lost": audit["lost"],
        "samples_duplicated": audit["duplicated"],
        "samples_drawn": audit["drawn"],
        "steps_completed": len(steps),
        "returned": sum(m["ledger/returned"] for m in steps),
        "recovery_seconds": [round(r.rejoined_at - k, 2) if r.rejoined_at else None for r, k in killed],
        "detection_seconds": [round(r.detected_at - k, 2) for r, k in killed],
        "recoveries": [
            {
                "by": r.by,
                "cause": r.cause[:300],
                "detected": round(r.detected_at - k, 2),
                **{stage: round(at - k, 2) for stage, at in r.marks.items()},
            }
            for r, k in killed
        ],
        "run_seconds": round(time.perf_counter() - started, 1),
    }
    return report, steps


def startup(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One-step ``rlsdk run`` in a fresh process without Ray, then with ``--ray``; both on CPU (Ray's actors
    ask for no GPU here, so on a GPU host the run without Ray would otherwise take one)."""
    options = {**run_options(opts, work), "num_rollout": 1, "engine_device": "cpu", "train_device": "cpu"}
    flags = [f"--set={key}={json.dumps(value)}" for key, value in options.items()]
    times = {}
    for name, extra in (("without_ray_s", []), ("with_ray_s", ["--ray"])):
        command = [sys.executable, "-m", "rlsdk_cli.app", "run", *flags, "--output", str(work / name), *extra]
        began = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times[name] = round(time.perf_counter() - began, 1)
    return {**times, "ray_adds_s": round(times["with_ray_s"] - times["without_ray_s"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spares", type=int, default=0, help="Spare engines started beside the two.")
    parser.add_argument(
        "--standbys", type=int, default=1, help="Standby engines (prepared, no model) beside the two."
    )
    parser.add_argument("--tiny", action="store_true", help="A 2-layer random Llama instead of SmolLM2-135M.")
    parser.add_argument("--no-startup", action="store_true", help="Skip the start-up comparison.")
    parser.add_argument("--startup-only", action="store_true", help="Only the start-up comparison.")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlsdk-faults-") as folder:
        work = Path(folder)
        report: dict[str, Any] = {
            "benchmark": "faults",
            "model": "tiny" if opts.tiny else "SmolLM2-135M",
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "cpu": platform.processor() or platform.machine(),
                "load_average_at_start": round(os.getloadavg()[0], 1),
            },
        }
        if opts.startup_only:
            print(json.dumps({**report, "startup": startup(opts, work)}))
            return
        report.update(
            engines=2, spares=opts.spares, standbys=opts.standbys, steps=opts.steps, **faults(opts, work)
        )
        if not opts.no_startup:
            report["startup"] = startup(opts, work)
    done = [s for s in report["recovery_seconds"] if s is not None]
    report["target_recovery_s"] = TARGET_RECOVERY_S
    report["meets_target"] = (
        report["samples_lost"] == 0
        and report["kills"] == opts.kills  # a run over before its kills proves nothing
        and len(done) == report["kills"]
        and all(s <= TARGET_RECOVERY_S for s in done)
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
