"""The rollout buffer service: slime-compatible HTTP endpoints for agents that produce trajectories
outside the trainer (``rlsdk buffer serve``), on aiohttp.

- ``POST /start_rollout``: a trainer starts the task_generator plugin named by ``task_type`` (a registered
  name only: never a path, which would run code the request names) in a worker thread, with the body as
  its ``data`` (``num_repeat_per_sample`` is the group size). The same task already running is not
  started twice, so a resumed trainer may ask again.
- ``POST /buffer/write``: an agent writes one trajectory ``{"instance_id", "uid", "messages", "reward",
  "extra_info"}``; it is validated (rewards finite), appended to disk (fsync) and only then acknowledged.
  A ``uid`` written twice is stored once, so agents may retry a write whose answer they did not get.
- ``POST /get_rollout_data``: a trainer takes complete groups (at most ``max_groups``; the task's
  ``is_valid_group`` and ``transform_group`` hooks apply). They are leased, not yet served: a trainer that
  sends ``lease_seconds`` acknowledges them with ``POST /ack_rollout_data {"lease_id"}``, and groups whose
  lease runs out are served again (``POST /release_rollout_data {"lease_id"}`` gives them back at once).
  For a client that does neither (slime's), the groups count as served once the whole answer has been
  written to its connection, and go back if the connection breaks first.
  Only acknowledged groups are logged as served on disk, so a crash at any point loses no group: at worst
  an unacknowledged one is served again.

Loopback by default; bound elsewhere it requires ``Authorization: Bearer <token>`` (see
:mod:`rlsdk.engines.service_guard`). Bodies are size-checked and read under a timeout, idle or slow
connections are closed, and the number of open connections is bounded.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import numbers
import os
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from aiohttp import web

from .. import _moved
from ..engines.protocol import BUFFER_TOKEN_ENV
from ..engines.service_guard import ConnectionLimits, Served, guard, is_loopback, normalize_hosts
from ..engines.service_guard import check_binding as _check_binding
from ..errors import PluginError
from ..plugins.manager import RlsdkPluginManager
from ..plugins.kinds import TaskGenerator
from ..plugins.records import Resolved
from ..sizes import SMALL, Budget, NotJson, TooCostly, parse_request

DEFAULT_MAX_BODY = 64 << 20
__getattr__ = _moved.forward(__name__, {"TOKEN_ENV": "rlsdk:BUFFER_TOKEN_ENV"})
DEFAULT_LEASE_SECONDS = 300.0
"""How long groups handed to a trainer wait for its acknowledgement before they are served again."""
DEFAULT_READ_TIMEOUT = 30.0
"""Seconds a connection may stay idle, or take to send a request, before it is closed."""
DEFAULT_MAX_HELD_BYTES = 1 << 30
"""Bytes of trajectories (as JSON) the buffer holds in memory until a trainer takes them (S18)."""
DEFAULT_MAX_CONNECTIONS = 256
"""Open connections at once; more are answered 503 and closed."""

WRITE_VALUES = 2 << 20
"""JSON values one ``/buffer/write`` may hold (a long trajectory's token ids and log-probs in its extra_info)."""
TASK_BUDGET = Budget(bytes=1 << 20, values=1 << 16)
"""A ``/start_rollout`` body: the task's settings, saved and handed to the task generator."""

_dumps = functools.partial(json.dumps, allow_nan=False)


class BufferFull(RuntimeError):
    """The items held in memory reached the store's limit: answered 507."""


class InvalidItem(ValueError):
    """A written trajectory that does not have the expected shape."""


def _finite(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer of hundreds of digits
        return False


def validate_item(item: Any) -> dict[str, Any]:
    """A trajectory item checked and normalized: ``instance_id`` and ``uid`` as strings, ``extra_info`` a
    dict, rewards finite."""
    if not isinstance(item, dict):
        raise InvalidItem(f"a trajectory must be a JSON object, got {type(item).__name__}")
    missing = [k for k in ("instance_id", "messages", "reward") if k not in item]
    if missing:
        raise InvalidItem(
            f"a trajectory needs {', '.join(missing)} (keys: instance_id, uid, messages, reward, extra_info)"
        )
    if not isinstance(item["instance_id"], (str, int)) or isinstance(item["instance_id"], bool):
        raise InvalidItem(f"instance_id must be a string or integer, got {item['instance_id']!r:.80}")
    messages = item["messages"]
    if not isinstance(messages, list) or not messages:
        raise InvalidItem("messages must be a non-empty list of chat messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidItem(f"messages[{i}] must be an object with a string 'role'")
        if message.get("content") is not None and not isinstance(message["content"], (str, list)):
            raise InvalidItem(f"messages[{i}].content must be a string, a list of parts or null")
    if not any(m["role"] == "assistant" for m in messages):
        raise InvalidItem("messages have no assistant turn to train on")
    reward = item["reward"]
    if isinstance(reward, dict):
        if not all(_finite(v) for v in reward.values()):
            raise InvalidItem(f"reward must be a number or an object of numbers (finite), got {reward!r:.80}")
    elif not _finite(reward):
        raise InvalidItem(f"reward must be a number (finite) or an object of numbers, got {reward!r:.80}")
    extra_info = item.get("extra_info", {})
    if not isinstance(extra_info, dict):
        raise InvalidItem("extra_info must be an object")
    normalized = {**item, "instance_id": str(item["instance_id"]), "extra_info": extra_info}
    if item.get("uid") is not None:
        normalized["uid"] = str(item["uid"])
    return normalized


def _default_meta_info(groups: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rewards = [
        i["reward"] for items in groups.values() for i in items if isinstance(i["reward"], numbers.Real)
    ]
    total = sum(len(items) for items in groups.values())
    return {
        "total_samples": total,
        "num_groups": len(groups),
        "avg_group_size": total / len(groups) if groups else 0,
        "avg_reward": sum(rewards) / len(rewards) if rewards else 0,
    }


@dataclass
class Lease:
    """Groups handed out and not yet acknowledged: ``groups`` by instance id, pending again at ``expires``."""

    expires: float
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class TrajectoryStore:
    """Trajectories grouped by ``instance_id``, kept in append-only JSONL files under ``folder``:
    ``items.jsonl`` (every accepted item), ``served.jsonl`` (uids of acknowledged groups) and ``task.json``
    (the last ``/start_rollout`` body). Reopening the folder restores every unacknowledged group; a last
    line cut by a crash (never acknowledged: the answer follows the fsync) is cut off the file, so the
    next append starts a line of its own. Items not yet acknowledged are held in memory up to
    ``max_held_bytes`` (of their JSON); past it a write is refused with :class:`BufferFull` (S18)."""

    def __init__(self, folder: str | Path, *, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_held_bytes = max_held_bytes
        self.held_bytes = 0
        """Bytes (as JSON) of the items held: pending or leased, not yet acknowledged."""
        self._sizes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.groups: dict[str, list[dict[str, Any]]] = {}
        self.leases: dict[str, Lease] = {}
        self.since_read: dict[str, list[dict[str, Any]]] = {}
        self.seen: set[str] = set()
        self.written = 0
        served = set(self._read_lines("served.jsonl"))
        for item in self._read_lines("items.jsonl"):
            self.seen.add(item["uid"])
            if item["uid"] not in served:
                self.groups.setdefault(item["instance_id"], []).append(item)
                self._hold(item["uid"], len(_dumps(item)))
            self.written += 1
        task = self.folder / "task.json"
        self.task: dict[str, Any] = json.loads(task.read_text()) if task.exists() else {}

    def _read_lines(self, name: str) -> list[Any]:
        path = self.folder / name
        if not path.exists():
            return []
        data = path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):  # a line cut by a crash mid-write
            with open(path, "r+b") as file:
                file.truncate(complete)
                os.fsync(file.fileno())
        return [json.loads(line) for line in data[:complete].splitlines() if line.strip()]

    def _append(self, name: str, values: list[Any]) -> None:
        with open(self.folder / name, "a", encoding="utf-8") as out:
            out.write("".join(_dumps(v) + "\n" for v in values))
            out.flush()
            os.fsync(out.fileno())

    def save_task(self, body: dict[str, Any]) -> None:
        with self.lock:
            tmp = self.folder / "task.json.tmp"
            tmp.write_text(_dumps(body))
            os.replace(tmp, self.folder / "task.json")
            self.task = body

    def append(self, item: dict[str, Any]) -> bool:
        """Store a validated item on disk, then in memory; False for a uid already stored. An item
        without a uid gets a random one, which no agent's uid can clash with."""
        with self.lock:
            if item.get("uid") is None:
                item = {**item, "uid": f"{item['instance_id']}#{uuid.uuid4().hex}"}
            if item["uid"] in self.seen:
                return False
            size = len(_dumps(item))
            if self.held_bytes + size > self.max_held_bytes:
                raise BufferFull(
                    f"the buffer holds {self.held_bytes / 2**20:.1f} MiB of trajectories no trainer has "
                    f"taken (limit {self.max_held_bytes / 2**20:.0f} MiB, --max-held-mb): write again once "
                    "a trainer took some"
                )
            self._append("items.jsonl", [item])
            self._hold(item["uid"], size)
            self.seen.add(item["uid"])
            self.written += 1
            self.groups.setdefault(item["instance_id"], []).append(item)
            self.since_read.setdefault(item["instance_id"], []).append(item)
            return True

    def lease_ready(
        self,
        task: TaskGenerator | None,
        *,
        max_groups: int | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> tuple[str | None, dict[str, Any]]:
        """Lease complete groups: (lease id, or None when there are none; ``{"data", "meta_info"}``).
        They stay on disk as unserved until :meth:`ack`; :meth:`release` or the lease's end returns them."""
        group_size = int(self.task.get("num_repeat_per_sample") or 1)
        task_type = self.task.get("task_type")
        is_valid = (task and task.is_valid_group) or (lambda group, size, _type: len(group[1]) >= size)
        transform = (task and task.transform_group) or (lambda group, _type: group)
        meta = (task and task.get_group_data_meta_info) or _default_meta_info
        with self.lock:
            self._expire(time.monotonic())
            meta_info = dict(meta(self.since_read))
            ready = [
                (iid, items)
                for iid, items in self.groups.items()
                if is_valid((iid, items), group_size, task_type)
            ]
            ready = ready[:max_groups] if max_groups is not None else ready
            data = []
            for instance_id, items in ready:
                data.extend(transform((instance_id, items), task_type)[1])
            lease_id = None
            if ready:
                lease_id = uuid.uuid4().hex
                self.leases[lease_id] = Lease(time.monotonic() + lease_seconds, dict(ready))
                for instance_id, _ in ready:
                    del self.groups[instance_id]
                self.since_read = {}
            meta_info["finished_groups"] = [iid for iid, _ in ready]
            meta_info["lease_id"] = lease_id
            return lease_id, {"data": data, "meta_info": meta_info}

    def ack(self, lease_id: str) -> int | None:
        """Log a lease's groups as served (fsync); the number of items, or None for an unknown or ended
        lease (its groups are pending again and will be served again)."""
        with self.lock:
            lease = self.leases.pop(lease_id, None)
            if lease is None:
                return None
            uids = [i["uid"] for items in lease.groups.values() for i in items]
            try:
                self._append("served.jsonl", uids)
            except BaseException:
                self.leases[lease_id] = lease
                raise
            for uid in uids:
                self.held_bytes -= self._sizes.pop(uid, 0)
            return len(uids)

    def _hold(self, uid: str, size: int) -> None:
        self._sizes[uid] = size
        self.held_bytes += size

    def release(self, lease_id: str) -> None:
        """Return a lease's groups to the pending ones, ahead of items written since."""
        with self.lock:
            lease = self.leases.pop(lease_id, None)
            if lease is not None:
                self._restore(lease)

    def _expire(self, now: float) -> None:
        for lease_id in [k for k, lease in self.leases.items() if lease.expires <= now]:
            self._restore(self.leases.pop(lease_id))

    def _restore(self, lease: Lease) -> None:
        for instance_id, items in lease.groups.items():
            self.groups[instance_id] = items + self.groups.get(instance_id, [])

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {
                "written": self.written,
                "pending_items": sum(len(v) for v in self.groups.values()),
                "pending_groups": len(self.groups),
                "leased_groups": sum(len(lease.groups) for lease in self.leases.values()),
            }


class BufferService:
    """The endpoints over a :class:`TrajectoryStore`, task generators resolved through ``pm``.

    A ``/start_rollout`` body names a file and URLs the task opens (``input_file``, ``remote_buffer_url``,
    ``remote_engine_url``); they reach the task only where the operator allowed them: ``input_file``
    inside one of ``input_dirs`` (symlinks resolved; none by default), ``remote_buffer_url`` this
    service itself (a loopback URL of its port) or a host of ``url_hosts``, ``remote_engine_url`` a
    loopback URL or a host of ``url_hosts``. Anything else is a 403 and the task does not start."""

    def __init__(
        self,
        pm: RlsdkPluginManager,
        store: TrajectoryStore,
        *,
        input_dirs: Sequence[str | os.PathLike[str]] = (),
        url_hosts: Sequence[str] = (),
    ) -> None:
        self.pm = pm
        self.store = store
        self.input_dirs = tuple(Path(d).resolve() for d in input_dirs)
        self.url_hosts = normalize_hosts(url_hosts)
        self.url = ""
        self.task_errors: list[str] = []
        self.tasks: dict[str, threading.Thread] = {}

    def task(self) -> Resolved[TaskGenerator] | None:
        name = self.store.task.get("task_type")
        if not name:
            return None
        return self.pm.resolve("task_generator", name, registered_only=True)

    def start_rollout(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("task_type"), str):
            return 400, {"success": False, "message": "start_rollout needs a JSON object with a 'task_type'"}
        try:
            size = int(body.get("num_repeat_per_sample") or 1)
            if size < 1:
                raise ValueError
        except (TypeError, ValueError):
            return 400, {"success": False, "message": "num_repeat_per_sample must be a positive integer"}
        try:
            task = self.pm.resolve("task_generator", body["task_type"], registered_only=True)
        except PluginError as exc:
            return 400, {"success": False, "message": str(exc)}
        refusal = self._refuse_named(body)
        if refusal is not None:
            return 403, {"success": False, "message": refusal}
        running = self.tasks.get(task.name)
        if running is not None and running.is_alive():
            return 200, {"success": True, "message": "Rollout already running", "task_type": task.name}
        body = {**body, "remote_buffer_url": body.get("remote_buffer_url") or self.url}
        self.store.save_task(body)
        thread = threading.Thread(
            target=self._run_task, args=(task, body), daemon=True, name=f"rlsdk-task-{task.name}"
        )
        thread.start()
        self.tasks[task.name] = thread
        return 200, {"success": True, "message": "Rollout started", "task_type": task.name}

    def _refuse_named(self, body: dict[str, Any]) -> str | None:
        """Why a file or URL the body names may not reach the task (None: all allowed); the URLs allowed
        are put back in ``body`` as they were checked (:func:`checked_url`), so that whatever HTTP client
        the task uses connects where the check looked."""
        path = body.get("input_file")
        if path is not None:
            if not isinstance(path, str) or not path or "\0" in path:
                return "input_file must be a path"
            if not any(Path(path).resolve().is_relative_to(folder) for folder in self.input_dirs):
                where = ", ".join(map(str, self.input_dirs)) or "no folder is allowed"
                return (
                    f"input_file {path[:200]!r} is not inside a folder the operator allowed ({where}; "
                    "start rlsdk buffer serve with --allow-input-dir FOLDER)"
                )
        own_port = urlsplit(self.url).port if self.url else None
        for key in ("remote_buffer_url", "remote_engine_url"):
            if body.get(key) is None:
                continue
            url, why = checked_url(body[key], key)
            if url is None:
                return why
            parts = urlsplit(url)
            host = parts.hostname or ""
            if host in self.url_hosts or "*" in self.url_hosts:
                body[key] = url
                continue
            local = is_loopback(host) and (key == "remote_engine_url" or parts.port == own_port)
            if not local:
                return (
                    f"{key} {url[:200]!r} names a host the operator did not allow "
                    "(start rlsdk buffer serve with --allow-url-host HOST)"
                )
            body[key] = url
        return None

    def _run_task(self, task: Any, body: dict[str, Any]) -> None:
        try:
            task.func(body)
        except Exception as exc:  # reported to the trainer through get_rollout_data
            self.task_errors.append(f"{task.describe()} raised {type(exc).__name__}: {exc}")
            traceback.print_exc()

    def write(self, body: Any) -> tuple[int, dict[str, Any]]:
        try:
            item = validate_item(body)
        except InvalidItem as exc:
            return 400, {"success": False, "message": f"invalid trajectory: {exc}"}
        try:
            stored = self.store.append(item)
        except BufferFull as exc:
            return 507, {"success": False, "message": str(exc)}
        message = (
            "Data has been successfully written to buffer" if stored else "duplicate uid: already stored"
        )
        return 200, {
            "success": True,
            "message": message,
            "data": {"data": [], "meta_info": self.store.counts()},
        }

    def get_rollout_data(self, body: Any) -> tuple[int, dict[str, Any], str | None]:
        """(status, answer, lease id or None); ``body`` may hold ``max_groups`` and ``lease_seconds``."""
        body = body if isinstance(body, dict) else {}
        max_groups, lease_seconds = body.get("max_groups"), body.get("lease_seconds", DEFAULT_LEASE_SECONDS)
        if max_groups is not None and (type(max_groups) is not int or max_groups < 1):
            message = f"max_groups must be a positive integer, got {max_groups!r:.40}"
            return 400, {"success": False, "message": message}, None
        if not _finite(lease_seconds) or lease_seconds <= 0:
            message = f"lease_seconds must be a positive number, got {lease_seconds!r:.40}"
            return 400, {"success": False, "message": message}, None
        task = self.task()
        try:
            lease_id, result = self.store.lease_ready(
                None if task is None else task.record, max_groups=max_groups, lease_seconds=lease_seconds
            )
        except Exception as exc:  # a group hook's: nothing was leased
            if task is None:
                raise
            message = f"{task.describe()}'s group hooks raised {type(exc).__name__}: {exc}"
            return 500, {"success": False, "message": message}, None
        result["meta_info"]["task_errors"] = list(self.task_errors)
        n = len(result["data"])
        message = f"Successfully read {n} items" if n else "No data available to read"
        return 200, {"success": bool(n), "message": message, "data": result}, lease_id

    def ack_rollout_data(self, body: Any) -> tuple[int, dict[str, Any]]:
        lease_id = body.get("lease_id") if isinstance(body, dict) else None
        if not isinstance(lease_id, str):
            return 400, {
                "success": False,
                "message": "ack_rollout_data needs a JSON object with a 'lease_id'",
            }
        acknowledged = self.store.ack(lease_id)
        if acknowledged is None:
            return 409, {
                "success": False,
                "message": f"unknown or ended lease {lease_id[:64]!r}: its groups "
                f"were not acknowledged and will be served again",
            }
        return 200, {
            "success": True,
            "message": f"{acknowledged} items acknowledged",
            "acknowledged": acknowledged,
        }

    def release_rollout_data(self, body: Any) -> tuple[int, dict[str, Any]]:
        """Give a lease's groups back at once, to be served again first (a trainer that restarted without
        them); an unknown or ended lease is already back."""
        lease_id = body.get("lease_id") if isinstance(body, dict) else None
        if not isinstance(lease_id, str):
            return 400, {
                "success": False,
                "message": "release_rollout_data needs a JSON object with a 'lease_id'",
            }
        self.store.release(lease_id)
        return 200, {"success": True, "message": "released: its groups will be served again"}


def checked_url(url: Any, key: str) -> tuple[str | None, str]:
    """``(url rebuilt from its parts, "")``, or ``(None, why not)``: an http(s) URL with no user part and
    no character that URL parsers read differently (a backslash, a space, a control character: urllib3
    ends the host at a ``\\`` where ``urlsplit`` and httpx read on), rebuilt as ``scheme://host:port/path``
    and read back by httpx to the same host and port: every client connects where the check looked."""
    if not isinstance(url, str):
        return None, f"{key} must be a URL"
    if any(ch == "\\" or ch.isspace() or not ch.isprintable() for ch in url):
        return None, f"{key} {url[:200]!r} has characters URL parsers read differently (\\, spaces, controls)"
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None, f"{key} {url[:200]!r} is not a URL"
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None, f"{key} {url[:200]!r} is not an http(s) URL"
    if "@" in parts.netloc:
        return None, f"{key} {url[:200]!r} names a user: give http(s)://host:port/path"
    scheme = parts.scheme.lower()
    port = port or (443 if scheme == "https" else 80)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    rebuilt = f"{scheme}://{netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    try:
        read = httpx.URL(rebuilt)
    except httpx.InvalidURL:
        return None, f"{key} {url[:200]!r} is not a URL"
    if read.host != host or (read.port or port) != port:
        return None, f"{key} {url[:200]!r} is read differently by HTTP clients"
    return rebuilt, ""


def check_binding(host: str, token: str | None) -> None:
    """Refuse to serve off loopback without a bearer token."""
    _check_binding("the rollout buffer", host, token, BUFFER_TOKEN_ENV)


# ----- HTTP ---------------------------------------------------------------------------------------------


def _reply(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


def _error(message: str, status: int) -> web.Response:
    return _reply({"success": False, "message": message}, status)


@dataclass
class BufferServer(Served):
    """A running buffer server: ``url`` (the service's); ``await close()`` stops it."""

    service: BufferService

    @property
    def url(self) -> str:
        return self.service.url


async def start_buffer_server(
    service: BufferService,
    host: str = "127.0.0.1",
    port: int = 8889,
    *,
    token: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    allowed_hosts: tuple[str, ...] | list[str] = (),
) -> BufferServer:
    """Serve ``service`` on ``host:port`` (port 0 picks a free one) until ``close()``; sets ``service.url``.
    Off loopback a ``token`` is required (ValueError otherwise)."""
    check_binding(host, token)
    limits = ConnectionLimits(
        max_body=max_body,
        read_timeout=read_timeout,
        idle_timeout=read_timeout,
        max_connections=max_connections,
    )
    app = limits.app([guard(token, _error, bind_host=host, allowed_hosts=allowed_hosts)], _error)
    app.add_routes(buffer_routes(service, max_body))
    runner, bound = await limits.serve(app, host, port, keepalive_timeout=read_timeout)
    service.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{bound}"
    return BufferServer(host, bound, runner, limits, service)


def buffer_routes(service: BufferService, max_body: int) -> list[web.RouteDef]:
    """slime's rollout-buffer routes on ``service``; bodies are JSON, read whole (the connection limits read
    them already) within each route's budget (``/buffer/write`` up to ``max_body``)."""

    async def read_body(request: web.Request, budget: Budget = SMALL) -> tuple[Any, web.Response | None]:
        """(the JSON body, None), or (None, the error answer): standard JSON within the route's ``budget``
        (:mod:`rlsdk.sizes`); ``limits`` has read it already."""
        try:
            return await parse_request(await request.read(), budget, standard=True), None
        except (TooCostly, NotJson) as exc:
            return None, _error(str(exc), exc.status)

    def endpoint(method: Any, budget: Budget = SMALL, *, in_thread: bool = False) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            body, error = await read_body(request, budget)
            if error is not None:
                return error
            # writes and acknowledgements fsync: off the event loop
            status, answer = await asyncio.to_thread(method, body) if in_thread else method(body)
            return _reply(answer, status)

        return handle

    async def get_rollout_data(request: web.Request) -> web.StreamResponse:
        body, error = await read_body(request)
        if error is not None:
            return error
        status, answer, lease_id = service.get_rollout_data(body)
        if lease_id is None or (isinstance(body, dict) and "lease_seconds" in body):
            return _reply(answer, status)  # a leasing client acknowledges what it received
        # a client that never acknowledges: served once the whole answer has left on its connection
        response = _reply(answer, status)
        try:
            await response.prepare(request)
            await response.write_eof()
        except BaseException:
            service.store.release(lease_id)
            raise
        await asyncio.to_thread(service.store.ack, lease_id)
        return response

    return [
        web.post("/start_rollout", endpoint(service.start_rollout, TASK_BUDGET)),
        web.post("/buffer/write", endpoint(service.write, Budget(max_body, WRITE_VALUES), in_thread=True)),
        web.post("/get_rollout_data", get_rollout_data),
        web.post("/ack_rollout_data", endpoint(service.ack_rollout_data, in_thread=True)),
        web.post("/release_rollout_data", endpoint(service.release_rollout_data)),
    ]
