"""The trainer in a Ray actor: the ``trainer`` plugin resolved and built in the actor's own environment,
driven through :class:`RemoteTrainer`, a :class:`rlsdk.trainer_api.PolicyTrainer` that forwards each
call. Its weights go to the engines through Ray's object store without a copy in the driver. A trainer
that dies stops the run, naming the last checkpoint to ``--resume`` from."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.weight_checksums import Layout
from ..errors import RlsdkError
from ..outputs import STATE_FILE
from ..plugins.manager import get_plugin_manager
from ..training_options import named_model_folder, trainer_world_size
from ..training.trainer import PolicyTrainer, build_trainer
from ..types import Sample
from .cluster import describe_place, first_line, import_ray, place, start, worker_info
from .environments import check_worker
from ..config import RolloutConfig
from ..plugins.kinds import Trainer


class TrainerLostError(RlsdkError):
    """The trainer actor died, or did not answer a call within ``ray_trainer_timeout``; the run stops."""


class TrainerActor:
    """A Ray actor holding the run's trainer."""

    def __init__(self, args: RolloutConfig) -> None:
        self.args = args
        self.trainer: PolicyTrainer | None = None

    def where(self) -> dict[str, Any]:
        """:func:`worker_info`, after importing what trainers build on (torch, and transformers' auto
        classes) where this environment has it: the trainer actor is launched beside the engines, so its
        seconds of imports overlap theirs rather than follow them."""
        if importlib.util.find_spec("transformers") is not None:
            from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 (imports torch)
        elif importlib.util.find_spec("torch") is not None:
            import torch  # noqa: F401

        return worker_info()

    def start(self, spec: str, hf_checkpoint: str | None) -> dict[str, str]:
        """Resolve the trainer plugin here and build it from ``hf_checkpoint`` (the engine's model folder,
        known once the engines started) unless the run names its own; the trainer's ``device`` and
        ``dtype`` (the trust check's tolerance depends on them)."""

        if hf_checkpoint and not self.args.hf_checkpoint:
            self.args = self.args.replace(hf_checkpoint=hf_checkpoint)
        self.trainer = build_trainer(get_plugin_manager().resolve("trainer", spec), self.args)
        return {name: str(getattr(self.trainer, name, "")) for name in ("device", "dtype")}

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.trainer, method)(*args)

    def ping(self) -> None:
        """Nothing: an answer says the actor is alive (:meth:`RemoteTrainer.lost`)."""

    def weights_ref(self) -> list[Any]:
        """The state dict put in the object store (:func:`.weights.to_shared`), its reference in a list (so
        the driver gets the reference, not the tensors)."""
        assert self.trainer is not None, "start() builds the trainer first"
        from .weights import to_shared

        return [import_ray().put(to_shared(self.trainer.weights()))]


@dataclass
class TrainerLaunch:
    """A trainer actor on its way: created, its :meth:`TrainerActor.where` sent, and its
    :meth:`TrainerActor.start` too when the model folder is known before the engines start."""

    actor: Any
    where: Any
    resources: dict[str, Any]
    started: Any = None

    def kill(self) -> None:
        import_ray().kill(self.actor)


def trainer_resources(args: RolloutConfig) -> dict[str, Any]:
    """What the trainer actor asks Ray for: a CPU, and a GPU per trainer process
    (``actor_num_gpus_per_node``, default TP x PP) with ``train_device`` ``cuda``, or ``auto`` on a
    cluster that has GPUs (the trainer's processes then see only those)."""
    device = str(getattr(args, "train_device", "auto"))
    on_gpus = device.startswith("cuda") or (
        device == "auto" and import_ray().cluster_resources().get("GPU", 0) > 0
    )
    return {"num_cpus": 1, "num_gpus": trainer_world_size(args) if on_gpus else 0}


def launch_trainer(args: RolloutConfig) -> TrainerLaunch:
    """Create the trainer actor now, before the engines start, so both start at once. With the model
    folder known already (``hf_checkpoint``, or ``model`` naming a folder), the trainer is built right after
    the actor's imports; otherwise once the engines name it (:class:`RemoteTrainer`)."""
    ray = import_ray()
    resources = trainer_resources(args)
    actor = ray.remote(TrainerActor).options(max_restarts=0, **resources).remote(args)
    where = actor.where.remote()  # an actor runs its calls in order: start() follows where()
    folder = named_model_folder(args)
    started = actor.start.remote(Trainer.chosen(args), str(folder.resolve())) if folder else None
    return TrainerLaunch(actor, where, resources, started)


class RemoteTrainer(PolicyTrainer):
    """The driver's side of a :class:`TrainerActor`, with the remote trainer's ``device`` and ``dtype``."""

    def __init__(
        self, args: RolloutConfig, spec: str, driver_plugins: dict[str, str | None], launch: TrainerLaunch
    ) -> None:
        self.output_dir = Path(args.output_dir)
        self.actor = launch.actor
        self.timeout = args.ray_trainer_timeout
        self._ping: Any = None
        self.place_text, built = asyncio.run(self._start(args, spec, driver_plugins, launch))
        self.device, self.dtype = built["device"], built["dtype"]

    @staticmethod
    async def _start(
        args: RolloutConfig, spec: str, driver_plugins: dict[str, str | None], launch: TrainerLaunch
    ) -> tuple[str, dict[str, str]]:
        ray, actor = import_ray(), launch.actor
        info = await place(actor, launch.where, "the trainer", launch.resources, args.ray_start_timeout)
        device = "cuda" if launch.resources["num_gpus"] else "cpu"
        place_text = describe_place(info, device=device, port=None)
        try:
            check_worker("the trainer", info, driver_plugins)
        except RlsdkError:
            ray.kill(actor)
            raise
        call = launch.started or actor.start.remote(spec, args.hf_checkpoint)
        return place_text, await start(actor, "the trainer", place_text, call, args.ray_start_timeout)

    def _call(self, method: str, *args: Any) -> Any:
        ray = import_ray()
        call = (
            self.actor.weights_ref.remote()
            if method == "weights_ref"
            else self.actor.call.remote(method, *args)
        )
        try:
            return ray.get(call, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor)
            raise TrainerLostError(
                f"the trainer actor's {method} did not return within {self.timeout:g}s "
                f"(--ray-trainer-timeout) on {self.place_text}: taken for hung, its actor stopped. "
                f"{last_checkpoint_advice(self.output_dir)}"
            ) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise self._died(first_line(exc)) from None

    def _died(self, cause: str, during: str = "") -> TrainerLostError:
        return TrainerLostError(
            f"the trainer died{during} ({self.place_text}): {cause}. {last_checkpoint_advice(self.output_dir)}"
        )

    def lost(self, during: str) -> TrainerLostError | None:
        """The error to stop the run with when the trainer actor died, found without waiting: a ping sent
        earlier failed (one still unanswered is sent again later). Called every second while the run waits
        for something else (an eval), so that it does not wait on after the trainer is gone."""
        ray = import_ray()
        if self._ping is None:
            self._ping = self.actor.ping.remote()
        ready, _ = ray.wait([self._ping], timeout=0)
        if not ready:
            return None
        ping, self._ping = self._ping, None
        try:
            ray.get(ping)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            return self._died(first_line(exc), during)
        return None

    def train_step(self, rollout_id: int, groups: list[list[Sample]]) -> dict[str, float]:
        return self._call("train_step", rollout_id, groups)

    def response_log_probs(self, samples: list[Sample]) -> list[list[float]]:
        return self._call("response_log_probs", samples)

    def weights(self) -> Mapping[str, Any]:
        """An object reference to the state dict, which the engine pool hands to each engine as it is."""
        return self._call("weights_ref")[0]

    def weight_checksums(self, layout: Layout) -> dict[str, tuple[list[str], list[str]]]:
        return self._call("weight_checksums", dict(layout))

    def save_hf_model(self, folder: Path) -> None:
        self._call("save_hf_model", folder)

    def save_checkpoint(self, folder: Path) -> None:
        self._call("save_checkpoint", folder)

    def load_checkpoint(self, folder: Path) -> None:
        self._call("load_checkpoint", folder)


def last_checkpoint_advice(output_dir: Path) -> str:
    """Where ``--resume`` would continue the run from, read from its ``state.json``."""
    try:
        checkpoint = json.loads((output_dir / STATE_FILE).read_text()).get("checkpoint")
    except (OSError, ValueError):
        checkpoint = None
    if not checkpoint:
        return (  # the folder may hold the steps written before: --overwrite starts afresh there
            f"No checkpoint was saved yet: start the run again (rlsdk run --overwrite --output {output_dir})"
        )
    where = output_dir / checkpoint  # relative to the run folder (older runs stored it absolute)
    return f"The last checkpoint is {where}: continue with rlsdk run --resume --output {output_dir}"
