"""What the Tinker API's requests do: sessions, training models, sampling sessions, checkpoints.

Each object belongs to the API key that created it (its ``owner``): another key finds nothing. Ids are the
SDK's own forms (``<session>:train:<n>``, ``<session>:sample:<n>``) over a random session id, so a model
cannot be reached without being told its session. A session whose client stopped heartbeating for
:data:`SESSION_TIMEOUT` seconds, or that finished, releases its models and samplers (checkpoints stay)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines.engine import InferenceEngine
from ..training.sync import trains_on_gpu, trust_check
from ..training.trust import check_weights
from ..training.trainer import LoraAdapter
from .checkpoints import META as CHECKPOINT_META
from .checkpoints import CheckpointPath, CheckpointStore, check_name, check_run_id, check_ttl
from .futures import Futures, Sequencer, UserError
from .losses import check_loss
from .sampling import BASE, MAX_SAMPLES, EngineSlot, SamplerWeights, check_request, sample
from .training import LoraSpec, Placement, TrainingRun
from .wire import ForwardBackward, write_forward_backward_output, write_sample_response

log = logging.getLogger(__name__)

SESSION_TIMEOUT = 600.0
"""Seconds without a heartbeat after which a session's models are released (the SDK beats every 10 s)."""
KEEP_SNAPSHOTS = 8
"""Samplers of a model's current weights (``save_weights_and_get_sampling_client``) whose weights are kept;
an older one's are released (an RL loop samples from the latest; ``save_weights_for_sampler(name)`` keeps
weights for good)."""


class NotFound(LookupError):
    """An id that names nothing this API key may see (404)."""


class Gone(LookupError):
    """A session that finished or expired (410: the SDK stops its heartbeat)."""


@dataclass
class Session:
    id: str
    owner: str
    user_metadata: dict[str, Any]
    display_name: str | None
    tags: list[str]
    created: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    finished: str | None = None
    status: dict[str, Any] = field(default_factory=lambda: {"type": "active"})
    """The SDK's ``SessionStatus``: active, client_finished (with its reason) or cancelled (expired)."""
    model_ids: list[str] = field(default_factory=list)
    sampler_ids: list[str] = field(default_factory=list)
    requests: dict[str, str] = field(default_factory=dict)
    """Creation requests by ``model:<n>``/``sampler:<n>``: a retried one gets the same request id."""


@dataclass
class Model:
    id: str
    session: Session
    base: str
    lora: LoraSpec | None
    user_metadata: dict[str, Any] | None
    run: TrainingRun | None = None
    sequencer: Sequencer = field(default_factory=Sequencer)
    last_request: float = field(default_factory=time.time)
    full_snapshot: SamplerWeights | None = None
    """A full fine-tune's latest sampler weights held in this process."""
    snapshots: list[SamplerWeights] = field(default_factory=list)
    """Its samplers' weights, oldest first (at most :data:`KEEP_SNAPSHOTS` kept)."""


@dataclass
class Sampler:
    id: str
    owner: str
    base: str
    model_path: str | None
    weights: SamplerWeights
    slot: EngineSlot
    index: int = 0
    """Samplers created before this one (for seeds derived from the server's ``sampling_seed``)."""
    requests: dict[int, tuple[str, list[str]]] = field(default_factory=dict)


EngineFactory = Callable[[Path | None], InferenceEngine]
"""Builds an (unstarted) engine for a base model's folder (None: the engine plugin's default model)."""


class TinkerService:
    """The server's state and operations; every method runs on the server's event loop."""

    def __init__(
        self,
        base_models: dict[str, Path | None],
        engine_factory: EngineFactory,
        checkpoint_root: Path,
        placement: Placement = Placement(),
        sampling_seed: int | None = None,
    ) -> None:
        """``sampling_seed``: requests that give no seed are seeded from it, the sampler's creation order and
        the request's ``seq_id`` (a run that repeats its requests samples the same tokens); None: unseeded."""
        self.base_models = dict(base_models)
        self.sampling_seed = sampling_seed
        self._samplers_made = 0
        self.folders: dict[str, Path] = {}
        self.engine_factory = engine_factory
        self.placement = placement
        self.store = CheckpointStore(checkpoint_root)
        self.futures = Futures()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, Sampler] = {}
        self.slots: dict[str, EngineSlot] = {}
        self._janitor: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start an engine for every base model (their folders are then known); begin expiring sessions."""
        for name in self.base_models:
            await self.slot(name)
        self._janitor = asyncio.ensure_future(self._expire_loop())

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
        for session in list(self.sessions.values()):
            self._release(session, "the server stopped")
        for slot in self.slots.values():
            await slot.engine.close()

    async def slot(self, base: str, full: bool = False) -> EngineSlot:
        """The engine serving ``base``'s model with the base weights and LoRA adapters (``full``: a second one
        for full fine-tunes' weights), started on first use."""
        key = f"{base}#full" if full else base
        if key not in self.slots:
            engine = self.engine_factory(self.base_models[base])
            self.slots[key] = EngineSlot(engine)
            try:
                await engine.start()
            except BaseException:
                del self.slots[key]
                raise
            folder = self.base_models[base] or getattr(engine, "model_path", None)
            if folder is None:
                raise ValueError(f"base model {base!r}: give its local folder (--model {base}=PATH)")
            self.folders[base] = Path(folder)
        return self.slots[key]

    def check_base(self, name: str | None) -> str:
        if name not in self.base_models:
            raise UserError(
                f"base_model {name!r} is not served here; choose one of {sorted(self.base_models)}"
            )
        return name

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, SESSION_TIMEOUT / 4))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.finished is None and now - session.last_seen > SESSION_TIMEOUT:
                    session.status = {"type": "cancelled", "detail": "no heartbeat"}
                    self._release(session, f"no heartbeat for {SESSION_TIMEOUT:.0f}s")
            await asyncio.to_thread(self.store.remove_expired)

    def _release(self, session: Session, reason: str) -> None:
        """Finish ``session``: its models' queued requests fail, their memory and its samplers go."""
        session.finished = session.finished or reason
        error = RuntimeError(f"session {session.id} ended ({reason})")
        for model_id in session.model_ids:
            model = self.models.pop(model_id, None)
            if model is not None:
                model.sequencer.cancel(error)
                for weights in model.snapshots:
                    _release_weights(weights)
                if model.run is not None:
                    model.run.close()
        for sampler_id in session.sampler_ids:
            self.samplers.pop(sampler_id, None)

    # ------------------------------------------------------------------ sessions

    def create_session(self, owner: str, request: Any) -> dict[str, Any]:
        session = Session(
            id=secrets.token_urlsafe(16),
            owner=owner,
            user_metadata=dict(request.user_metadata or {}),
            display_name=request.display_name,
            tags=list(request.tags),
        )
        self.sessions[session.id] = session
        return {"type": "create_session", "session_id": session.id}

    def session(self, owner: str, session_id: str, live: bool = True) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.owner != owner:
            raise NotFound(f"no session {str(session_id)[:80]!r}")
        if live and session.finished is not None:
            raise Gone(f"session {session_id} has ended ({session.finished})")
        return session

    def heartbeat(self, owner: str, session_id: str) -> dict[str, Any]:
        self.session(owner, session_id).last_seen = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish(self, owner: str, session_id: str, body: Any) -> None:
        session = self.session(owner, session_id, live=False)
        if session.finished is None:
            reason = body.get("reason", {}).get("type", "success") if isinstance(body, dict) else "success"
            if reason not in ("success", "errored", "interrupted"):
                raise UserError(f"reason.type: success, errored or interrupted, got {reason!r}")
            detail = body.get("detail") if isinstance(body, dict) else None
            session.status = {"type": "client_finished", "reason": {"type": reason}, "detail": detail}
            self._release(session, f"the client finished it: {reason}")

    # ------------------------------------------------------------------ training models

    def model(self, owner: str, model_id: str) -> Model:
        model = self.models.get(model_id)
        if model is None or model.session.owner != owner:
            raise NotFound(f"no training model {str(model_id)[:80]!r} (it may have ended with its session)")
        model.last_request = time.time()
        return model

    def create_model(self, owner: str, request: Any) -> str:
        session = self.session(owner, request.session_id)
        key = f"model:{request.model_seq_id}"
        if key in session.requests:
            return session.requests[key]
        base = self.check_base(request.base_model)
        _check_optimizer(request.optimizer_config)
        lora = None
        if request.lora_config is not None:
            c = request.lora_config
            lora = LoraSpec(c.rank, c.seed, c.train_mlp, c.train_attn, c.train_unembed)
        model = Model(
            f"{session.id}:train:{request.model_seq_id}", session, base, lora, request.user_metadata
        )

        async def create() -> dict[str, Any]:
            await self._build(model)
            return {"type": "create_model", "model_id": model.id}

        session.requests[key] = self.futures.run(owner, "create_model", create())
        return session.requests[key]

    async def _build(self, model: Model, state: Path | None = None, optimizer: bool = False) -> None:
        """Load the model (and a saved state), register it, write its ``run.json``."""
        await self.slot(model.base)
        run = await asyncio.to_thread(TrainingRun, self.folders[model.base], model.lora, self.placement)
        if state is not None:
            await asyncio.to_thread(run.load_state, state, optimizer)
        if model.session.finished is not None:  # the session ended while the model loaded
            run.close()
            raise Gone(f"session {model.session.id} has ended ({model.session.finished})")
        model.run = run
        self.models[model.id] = model
        model.session.model_ids.append(model.id)
        meta = {
            "owner": model.session.owner,
            "base_model": model.base,
            "lora": None if model.lora is None else model.lora.to_json(),
            "user_metadata": model.user_metadata,
            "session_id": model.session.id,
        }
        await asyncio.to_thread(self.store.write_run, model.id, meta)

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        model = self.model(owner, model_id)
        assert model.run is not None
        config = model.run.model.config
        return {
            "type": "get_info",
            "model_data": {
                "arch": getattr(config, "model_type", None),
                "model_name": model.base,
                "tokenizer_id": str(self.folders[model.base]),
            },
            "model_id": model.id,
            "is_lora": model.lora is not None,
            "lora_rank": None if model.lora is None else model.lora.rank,
            "model_name": model.base,
        }

    def forward_backward(self, owner: str, request: ForwardBackward) -> str:
        model = self.model(owner, request.model_id)
        config = check_loss(request.loss_fn, request.config, request.data)
        run = model.run
        assert run is not None

        async def operation() -> bytes:
            outputs, metrics = await asyncio.to_thread(
                run.forward_backward, request.data, request.loss_fn, config, not request.forward_only
            )
            return write_forward_backward_output(outputs, metrics)

        kind = "forward" if request.forward_only else "forward_backward"
        return model.sequencer.submit(self.futures, owner, kind, request.seq_id, operation)

    def optim_step(self, owner: str, request: Any) -> str:
        model = self.model(owner, request.model_id)
        params = request.optim_params
        if getattr(params, "type", "adamw") != "adamw" or not hasattr(params, "beta1"):
            raise UserError(f"optim_params: {type(params).__name__} is not supported here (AdamParams only)")
        run = model.run
        assert run is not None

        async def operation() -> dict[str, Any]:
            return {"metrics": await asyncio.to_thread(run.optim_step, params)}

        return model.sequencer.submit(self.futures, owner, "optim_step", request.seq_id, operation)

    def save_state(self, owner: str, request: Any) -> str:
        model = self.model(owner, request.model_id)
        path = CheckpointPath(model.id, "weights", check_name(request.path or f"state-{request.seq_id}"))
        ttl = check_ttl(request.ttl_seconds)
        run = model.run
        assert run is not None

        async def operation() -> dict[str, Any]:
            staging = self.store.begin(path, request.overwrite)
            await asyncio.to_thread(run.save_state, staging)
            self.store.commit(path, staging, self._checkpoint_meta(model, request.user_metadata, ttl))
            return {"type": "save_weights", "path": path.tinker_path}

        return model.sequencer.submit(self.futures, owner, "save_weights", request.seq_id, operation)

    def save_for_sampler(self, owner: str, request: Any) -> str:
        """``save_weights_for_sampler``: with a ``path``, a sampler checkpoint on disk; without, an ephemeral
        sampler whose weights go to the engine at once, checked there (the trust check)."""
        model = self.model(owner, request.model_id)
        run = model.run
        assert run is not None
        if request.path is not None:
            path = CheckpointPath(model.id, "sampler_weights", check_name(request.path))
            ttl = check_ttl(request.ttl_seconds)

            async def persistent() -> dict[str, Any]:
                staging = self.store.begin(path, overwrite=True)
                await asyncio.to_thread(run.save_sampler, staging)
                self.store.commit(path, staging, self._checkpoint_meta(model, request.user_metadata, ttl))
                return {"type": "save_weights_for_sampler", "path": path.tinker_path}

            return model.sequencer.submit(self.futures, owner, "save_sampler", request.seq_id, persistent)
        if request.sampling_session_seq_id is None:
            raise UserError("save_weights_for_sampler: give a path, or a sampling_session_seq_id")
        sampler_id = f"{model.session.id}:sample:{request.sampling_session_seq_id}"

        async def ephemeral() -> dict[str, Any]:
            slot = await self.slot(model.base, full=model.lora is None)
            weights = await asyncio.to_thread(self._snapshot, model, sampler_id, slot.engine)
            async with slot.serving(weights):
                exact = False
                if model.lora is None and trains_on_gpu(run.trainer):  # every tensor by checksum
                    verdict = await check_weights(slot.engine, run.trainer, len(self.samplers))
                    exact = verdict.complete
                diff = await trust_check(
                    slot.engine, run.trainer, run.probe, run.tolerance, enforce=not exact
                )
            log.info("sampler %s: trust check passed (largest log-prob gap %.2g nats)", sampler_id, diff)
            self._add_sampler(Sampler(sampler_id, owner, model.base, None, weights, slot), model.session)
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}

        return model.sequencer.submit(self.futures, owner, "save_sampler", request.seq_id, ephemeral)

    def _snapshot(self, model: Model, key: str, engine: InferenceEngine) -> SamplerWeights:
        """The model's current weights for a sampler: in this process for an engine that takes them so (a
        full fine-tune keeps one such copy: its sampler before gives its copy up), else written to a folder
        the engine loads."""
        run = model.run
        assert run is not None
        weights = SamplerWeights(key, is_lora=run.lora is not None)
        if not engine.in_process_weights:
            weights.folder = self.store.root / ".ephemeral" / key.replace(":", "_")
            run.save_sampler(weights.folder)
            return weights
        taken = run.sampler_weights()
        if isinstance(taken, LoraAdapter):
            weights.adapter = taken
        else:
            if model.full_snapshot is not None:
                model.full_snapshot.full = None
            weights.full = taken
            model.full_snapshot = weights
        model.snapshots.append(weights)
        for old in model.snapshots[:-KEEP_SNAPSHOTS]:
            _release_weights(old)
        del model.snapshots[:-KEEP_SNAPSHOTS]
        return weights

    def _checkpoint_meta(self, model: Model, user_metadata: Any, ttl: int | None) -> dict[str, Any]:
        return {
            "owner": model.session.owner,
            "base_model": model.base,
            "lora": None if model.lora is None else model.lora.to_json(),
            "user_metadata": user_metadata,
            "expires_at": None if ttl is None else time.time() + ttl,
            "public": False,
        }

    def save_external(self, owner: str, request: Any) -> str:
        model = self.model(owner, request.model_id)
        if request.age_encryption_recipients:
            raise UserError("age_encryption_recipients: encryption is not supported here")
        path = CheckpointPath(
            model.id, "external_weights", check_name(request.path or f"external-{request.seq_id}")
        )
        ttl = check_ttl(request.ttl_seconds)
        run = model.run
        assert run is not None

        async def operation() -> dict[str, Any]:
            staging = self.store.begin(path, overwrite=True)
            await asyncio.to_thread(run.save_merged, staging)
            self.store.commit(path, staging, self._checkpoint_meta(model, None, ttl))
            return {"type": "save_weights_external", "path": path.tinker_path}

        return model.sequencer.submit(self.futures, owner, "save_external", request.seq_id, operation)

    def checkpoint(self, owner: str, tinker_path: str) -> tuple[CheckpointPath, dict[str, Any]]:
        path = CheckpointPath.parse(tinker_path)
        meta = self.store.meta(path)
        if meta is None or (meta.get("owner") != owner and not meta.get("public")):
            raise NotFound(f"no checkpoint {tinker_path}")
        return path, meta

    def load_weights(self, owner: str, request: Any) -> str:
        """Load a state into a model: the model named (``model_id``), or a new one (``session_id`` and
        ``model_seq_id``: ``create_training_client_from_state``)."""
        path, meta = self.checkpoint(owner, request.path)
        if request.optimizer and path.segment != "weights":
            raise UserError(f"{request.path}: optimizer state is in training checkpoints (…/weights/…) only")
        folder = self.store.folder(path)
        if request.model_id is not None:
            model = self.model(owner, request.model_id)
            if meta["base_model"] != model.base or (meta["lora"] is None) != (model.lora is None):
                raise UserError(f"{request.path} holds weights of another kind of model than {model.id}'s")
            run = model.run
            assert run is not None

            async def operation() -> dict[str, Any]:
                await asyncio.to_thread(run.load_state, folder, request.optimizer)
                return {"type": "load_weights", "path": request.path, "model_id": model.id}

            return model.sequencer.submit(self.futures, owner, "load_weights", request.seq_id, operation)
        if request.session_id is None or request.model_seq_id is None:
            raise UserError("load_weights: name model_id, or session_id with model_seq_id")
        session = self.session(owner, request.session_id)
        key = f"model:{request.model_seq_id}"
        if key in session.requests:
            return session.requests[key]
        if request.base_model is not None and request.base_model != meta["base_model"]:
            raise UserError(
                f"base_model {request.base_model!r}: {request.path} was trained on {meta['base_model']!r}"
            )
        if not request.optimizer:
            _check_optimizer(request.optimizer_config)
        base = self.check_base(meta["base_model"])
        lora = None if meta["lora"] is None else LoraSpec(**meta["lora"])
        metadata = request.user_metadata
        model = Model(f"{session.id}:train:{request.model_seq_id}", session, base, lora, metadata)

        async def create() -> dict[str, Any]:
            await self._build(model, folder, request.optimizer)
            return {"type": "load_weights", "path": request.path, "model_id": model.id}

        session.requests[key] = self.futures.run(owner, "load_weights", create())
        return session.requests[key]

    # ------------------------------------------------------------------ sampling

    def _add_sampler(self, sampler: Sampler, session: Session) -> None:
        sampler.index = self._samplers_made
        self._samplers_made += 1
        self.samplers[sampler.id] = sampler
        session.sampler_ids.append(sampler.id)

    async def create_sampling_session(self, owner: str, request: Any) -> dict[str, Any]:
        session = self.session(owner, request.session_id)
        sampler_id = f"{session.id}:sample:{request.sampling_session_seq_id}"
        if sampler_id not in self.samplers:
            if request.model_path is not None:
                path, meta = self.checkpoint(owner, request.model_path)
                base = self.check_base(meta["base_model"])
                is_lora = meta["lora"] is not None
                folder = self.store.folder(path)
                weights = SamplerWeights(path.tinker_path, folder=folder, is_lora=is_lora)
                slot = await self.slot(base, full=not is_lora)
            else:
                base = self.check_base(request.base_model)
                weights, slot = BASE, await self.slot(base)
            self._add_sampler(Sampler(sampler_id, owner, base, request.model_path, weights, slot), session)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def sampler(self, owner: str, sampler_id: str) -> Sampler:
        sampler = self.samplers.get(sampler_id)
        if sampler is None or sampler.owner != owner:
            raise NotFound(
                f"no sampling session {str(sampler_id)[:80]!r} (it may have ended with its session)"
            )
        return sampler

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        sampler = self.sampler(owner, sampler_id)
        return {"sampler_id": sampler.id, "base_model": sampler.base, "model_path": sampler.model_path}

    def asample(self, owner: str, request: Any) -> dict[str, Any]:
        if request.sampling_session_id is None:
            raise UserError("sampling_session_id: create a sampling session first (the SDK always does)")
        sampler = self.sampler(owner, request.sampling_session_id)
        seq = request.seq_id
        if seq is not None and seq in sampler.requests:
            request_id, sequence_ids = sampler.requests[seq]
        else:
            prompt = check_request(request)

            default = None
            if self.sampling_seed is not None:
                run = self.sampling_seed * 1_000_003 + sampler.index
                default = (run * 1_000_033 + (seq or 0)) * MAX_SAMPLES % 2**62  # sample i: default + i

            async def work() -> bytes:
                output = await sample(sampler.slot, sampler.weights, request, prompt, sampler.id, default)
                return write_sample_response(output)

            request_id = self.futures.run(owner, "sample", work())
            sequence_ids = [f"{sampler.id}:{seq}:{i}" for i in range(request.num_samples)]
            if seq is not None:
                sampler.requests[seq] = (request_id, sequence_ids)
        return {"request_id": request_id, "sample_sequence_ids": sequence_ids}

    # ------------------------------------------------------------------ the REST API

    def capabilities(self) -> dict[str, Any]:
        models = []
        for name in self.base_models:
            config = getattr(getattr(self.slots.get(name), "engine", None), "model", None)
            context = getattr(getattr(config, "config", None), "max_position_embeddings", None)
            models.append(
                {"model_name": name, "max_context_length": context, "trainable": True, "sampleable": True}
            )
        return {"supported_models": models}

    def training_run(self, owner: str, run_id: str) -> dict[str, Any]:
        meta = self.store.read_run(check_run_id(run_id))
        if meta is None or meta.get("owner") != owner:
            raise NotFound(f"no training run {run_id}")
        checkpoints = self.store.listing(run_id)
        last: dict[str, dict[str, Any] | None] = {"training": None, "sampler": None}
        for path, cmeta in checkpoints:
            if path.kind in last:
                last[path.kind] = self.store.describe(path, cmeta)
        live = self.models.get(run_id)
        lora = meta.get("lora")
        seen = live.last_request if live is not None else self.store.run_folder(run_id).stat().st_mtime
        return {
            "training_run_id": run_id,
            "base_model": meta["base_model"],
            "model_owner": owner,
            "is_lora": lora is not None,
            "lora_rank": None if lora is None else lora["rank"],
            "last_request_time": _iso(seen),
            "last_checkpoint": last["training"],
            "last_sampler_checkpoint": last["sampler"],
            "user_metadata": meta.get("user_metadata"),
        }

    def training_runs(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        runs = [run_id for run_id, meta in self.store.runs() if meta.get("owner") == owner][::-1]
        page = runs[offset : offset + limit]
        return {
            "training_runs": [self.training_run(owner, r) for r in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)},
        }

    def weights_info(self, owner: str, tinker_path: str) -> dict[str, Any]:
        _, meta = self.checkpoint(owner, tinker_path)
        lora = meta.get("lora")
        return {
            "base_model": meta["base_model"],
            "is_lora": lora is not None,
            "lora_rank": None if lora is None else lora["rank"],
            **({} if lora is None else {k: lora[k] for k in ("train_unembed", "train_mlp", "train_attn")}),
        }

    def checkpoints(self, owner: str, run_id: str) -> dict[str, Any]:
        self.training_run(owner, run_id)  # exists, and is this key's
        return {"checkpoints": [self.store.describe(p, m) for p, m in self.store.listing(run_id)]}

    def user_checkpoints(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        found = [
            (meta.get("created", 0.0), path, meta)
            for run_id, run in self.store.runs()
            if run.get("owner") == owner
            for path, meta in self.store.listing(run_id)
        ]
        found.sort(key=lambda item: item[0], reverse=True)
        page = found[offset : offset + limit]
        return {
            "checkpoints": [self.store.describe(path, meta) for _, path, meta in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(found)},
        }

    def own_checkpoint(self, owner: str, run_id: str, checkpoint_id: str) -> CheckpointPath:
        path, meta = self.checkpoint(owner, f"tinker://{run_id}/{checkpoint_id}")
        if meta.get("owner") != owner:
            raise NotFound(f"no checkpoint {path.tinker_path} of this API key")
        return path

    def external_files(self, owner: str, run_id: str, checkpoint_id: str) -> list[str]:
        """The files of an ``external_weights`` checkpoint of this key, relative to its folder."""
        path = self.own_checkpoint(owner, run_id, checkpoint_id)
        if path.segment != "external_weights":
            raise UserError(f"{path.tinker_path}: download URLs are for external_weights checkpoints")
        folder = self.store.folder(path)
        return sorted(
            str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file() and f.name != CHECKPOINT_META
        )

    def external_file(self, run_id: str, checkpoint_id: str, name: str) -> Path:
        """One file of an external checkpoint (a signed URL named it: no owner to check), inside its folder."""
        path = CheckpointPath.parse(f"tinker://{run_id}/{checkpoint_id}")
        if path.segment != "external_weights" or self.store.meta(path) is None:
            raise NotFound(f"no checkpoint {path.tinker_path}")
        folder = self.store.folder(path)
        file = (folder / name).resolve()
        if folder not in file.parents or not file.is_file() or file.name == CHECKPOINT_META:
            raise NotFound(f"no file {name[:120]!r} in {path.tinker_path}")
        return file

    def delete_checkpoint(self, owner: str, run_id: str, checkpoint_id: str) -> None:
        self.store.delete(self.own_checkpoint(owner, run_id, checkpoint_id))

    def publish(self, owner: str, run_id: str, checkpoint_id: str, public: bool) -> None:
        self.store.update(self.own_checkpoint(owner, run_id, checkpoint_id), public=public)

    def set_ttl(self, owner: str, run_id: str, checkpoint_id: str, ttl: int | None) -> None:
        expires = None if check_ttl(ttl) is None else time.time() + ttl  # type: ignore[operator]
        self.store.update(self.own_checkpoint(owner, run_id, checkpoint_id), expires_at=expires)

    def storage_usage(self, owner: str) -> dict[str, Any]:
        listing = self.user_checkpoints(owner, limit=1 << 30, offset=0)["checkpoints"]
        size = sum(c["size_bytes"] or 0 for c in listing)
        item = {"checkpoint_count": len(listing), "size_bytes": size, "size_gigabytes": size / 1e9}
        return {"data": [item], "effective_rate_usd_per_gigabyte_month": None}

    def session_info(self, owner: str, session_id: str) -> dict[str, Any]:
        session = self.session(owner, session_id, live=False)
        return {
            "training_run_ids": session.model_ids,
            "sampler_ids": session.sampler_ids,
            "user_metadata": session.user_metadata or None,
            "display_name": session.display_name,
        }

    def list_sessions(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        ids = [s.id for s in self.sessions.values() if s.owner == owner][::-1]
        return {"sessions": ids[offset : offset + limit]}

    def search_sessions(self, owner: str, request: Any) -> dict[str, Any]:
        """This key's sessions matching ``request`` (``SessionSearchRequest``), newest first, a page at a time."""
        if getattr(request.owner, "type", "own") == "user" or request.project_ids:
            raise UserError("owner and project_ids: this server has one project per API key; search your own")
        statuses = {query.type for query in request.statuses or []}
        cursor = request.cursor
        found = []
        for session in sorted(self.sessions.values(), key=lambda s: (s.created, s.id), reverse=True):
            named = (request.session_id is None and request.display_name is None) or (
                session.id == request.session_id
                or (
                    request.display_name is not None
                    and all(
                        w in (session.display_name or "").lower()
                        for w in request.display_name.lower().split()
                    )
                )
            )
            metadata = all(session.user_metadata.get(k) == v for k, v in request.user_metadata.items())
            status = not statuses or session.status["type"] in statuses
            after = cursor is None or (session.created, session.id) < (
                cursor.last_created_at.timestamp(),
                cursor.last_session_id,
            )
            if session.owner == owner and named and metadata and status and after:
                found.append(session)
        page = found[: request.limit]
        summaries = [
            {
                "session_id": s.id,
                "created_at": _iso(s.created),
                "owner": owner,
                "project_id": "default",
                "status": s.status,
                "checkpoints_count": sum(
                    len(self.store.listing(m)) for m in s.model_ids if self.store.read_run(m)
                ),
                "display_name": s.display_name,
                "user_metadata": s.user_metadata or None,
            }
            for s in page
        ]
        more = len(found) > request.limit
        last = page[-1] if page else None
        next_cursor = (
            {"last_created_at": _iso(last.created), "last_session_id": last.id} if more and last else None
        )
        return {"sessions": summaries, "next_cursor": next_cursor}


def _release_weights(weights: SamplerWeights) -> None:
    """Free a sampler's weights (memory, and the folder written for an engine that loads from disk); the
    sampler then refuses requests, unless its engine still serves them."""
    weights.adapter = weights.full = None
    if weights.folder is not None:
        shutil.rmtree(weights.folder, ignore_errors=True)
        weights.folder = None


def _check_optimizer(config: Any) -> None:
    kind = getattr(config, "type", "adamw")
    if kind != "adamw":
        raise UserError(f"optimizer_config: {kind!r} is not supported here (adamw only)")


def _iso(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).isoformat()
