"""The rollout buffer service: slime-compatible HTTP endpoints for agents that produce trajectories
outside the trainer (``rlsdk buffer serve``).

- ``POST /start_rollout``: a trainer starts the task_generator plugin named by ``task_type`` in a
  worker thread, with the body as its ``data`` (``num_repeat_per_sample`` is the group size).
- ``POST /buffer/write``: an agent writes one trajectory ``{"instance_id", "uid", "messages", "reward",
  "extra_info"}``; it is validated, appended to disk (fsync) and only then acknowledged. A ``uid``
  written twice is stored once, so agents may retry a write whose answer they did not get.
- ``POST /get_rollout_data``: a trainer takes every complete group (the task's ``is_valid_group`` and
  ``transform_group`` hooks apply); served groups are logged to disk too, so a restart serves each
  group once and loses none.

Loopback by default; bound elsewhere it requires ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import ipaddress
import json
import numbers
import os
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .errors import PluginError
from .manager import RlsdkPluginManager
from .records import TaskGenerator
from .service_guard import is_json, token_matches

DEFAULT_MAX_BODY = 64 << 20
TOKEN_ENV = "RLSDK_BUFFER_TOKEN"


class InvalidItem(ValueError):
    """A written trajectory that does not have the expected shape."""


def validate_item(item: Any) -> dict[str, Any]:
    """A trajectory item checked and normalized: ``instance_id`` and ``uid`` as strings, ``extra_info`` a dict."""
    if not isinstance(item, dict):
        raise InvalidItem(f"a trajectory must be a JSON object, got {type(item).__name__}")
    missing = [k for k in ("instance_id", "messages", "reward") if k not in item]
    if missing:
        raise InvalidItem(f"a trajectory needs {', '.join(missing)} (keys: instance_id, uid, messages, reward, extra_info)")
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
    if not (isinstance(reward, numbers.Real) and not isinstance(reward, bool)) and not isinstance(reward, dict):
        raise InvalidItem(f"reward must be a number or an object of numbers, got {reward!r:.80}")
    extra_info = item.get("extra_info", {})
    if not isinstance(extra_info, dict):
        raise InvalidItem("extra_info must be an object")
    normalized = {**item, "instance_id": str(item["instance_id"]), "extra_info": extra_info}
    if item.get("uid") is not None:
        normalized["uid"] = str(item["uid"])
    return normalized


def _default_meta_info(groups: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rewards = [i["reward"] for items in groups.values() for i in items if isinstance(i["reward"], numbers.Real)]
    total = sum(len(items) for items in groups.values())
    return {"total_samples": total, "num_groups": len(groups),
            "avg_group_size": total / len(groups) if groups else 0,
            "avg_reward": sum(rewards) / len(rewards) if rewards else 0}


class TrajectoryStore:
    """Trajectories grouped by ``instance_id``, kept in append-only JSONL files under ``folder``:
    ``items.jsonl`` (every accepted item), ``served.jsonl`` (uids handed to a trainer) and ``task.json``
    (the last ``/start_rollout`` body). Reopening the folder restores the unserved groups."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.groups: dict[str, list[dict[str, Any]]] = {}
        self.since_read: dict[str, list[dict[str, Any]]] = {}
        self.seen: set[str] = set()
        self.written = 0
        served = set(self._read_lines("served.jsonl"))
        for item in self._read_lines("items.jsonl"):
            self.seen.add(item["uid"])
            if item["uid"] not in served:
                self.groups.setdefault(item["instance_id"], []).append(item)
            self.written += 1
        task = self.folder / "task.json"
        self.task: dict[str, Any] = json.loads(task.read_text()) if task.exists() else {}

    def _read_lines(self, name: str) -> list[Any]:
        path = self.folder / name
        if not path.exists():
            return []
        values = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                values.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write was never acknowledged
        return values

    def _append(self, name: str, values: list[Any]) -> None:
        with open(self.folder / name, "a", encoding="utf-8") as out:
            out.write("".join(json.dumps(v) + "\n" for v in values))
            out.flush()
            os.fsync(out.fileno())

    def save_task(self, body: dict[str, Any]) -> None:
        with self.lock:
            tmp = self.folder / "task.json.tmp"
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.folder / "task.json")
            self.task = body

    def append(self, item: dict[str, Any]) -> bool:
        """Store a validated item on disk, then in memory; False for a uid already stored."""
        with self.lock:
            if item.get("uid") is None:
                item = {**item, "uid": f"{item['instance_id']}#{self.written}"}
            if item["uid"] in self.seen:
                return False
            self._append("items.jsonl", [item])
            self.seen.add(item["uid"])
            self.written += 1
            self.groups.setdefault(item["instance_id"], []).append(item)
            self.since_read.setdefault(item["instance_id"], []).append(item)
            return True

    def take_ready(self, task: TaskGenerator | None) -> dict[str, Any]:
        """Remove and return the complete groups' items (``{"data", "meta_info"}``), logged as served."""
        group_size = int(self.task.get("num_repeat_per_sample") or 1)
        task_type = self.task.get("task_type")
        is_valid = (task and task.is_valid_group) or (lambda group, size, _type: len(group[1]) >= size)
        transform = (task and task.transform_group) or (lambda group, _type: group)
        meta = (task and task.get_group_data_meta_info) or _default_meta_info
        with self.lock:
            meta_info = dict(meta(self.since_read))
            ready = [(iid, items) for iid, items in self.groups.items() if is_valid((iid, items), group_size, task_type)]
            data = []
            for instance_id, items in ready:
                data.extend(transform((instance_id, items), task_type)[1])
            if ready:
                self._append("served.jsonl", [i["uid"] for _, items in ready for i in items])
                for instance_id, _ in ready:
                    del self.groups[instance_id]
                self.since_read = {}
            meta_info["finished_groups"] = [iid for iid, _ in ready]
            return {"data": data, "meta_info": meta_info}

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"written": self.written, "pending_items": sum(len(v) for v in self.groups.values()),
                    "pending_groups": len(self.groups)}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BufferService:
    """The endpoints over a :class:`TrajectoryStore`, task generators resolved through ``pm``."""

    def __init__(self, pm: RlsdkPluginManager, store: TrajectoryStore) -> None:
        self.pm = pm
        self.store = store
        self.url = ""
        self.task_errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def task(self) -> TaskGenerator | None:
        name = self.store.task.get("task_type")
        if not name:
            return None
        return self.pm.resolve("task_generator", name, registered_only=True).record  # type: ignore[return-value]

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
        body = {**body, "remote_buffer_url": body.get("remote_buffer_url") or self.url}
        self.store.save_task(body)
        thread = threading.Thread(target=self._run_task, args=(task, body), daemon=True,
                                  name=f"rlsdk-task-{task.name}")
        thread.start()
        self.threads.append(thread)
        return 200, {"success": True, "message": "Rollout started", "task_type": task.name}

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
        stored = self.store.append(item)
        message = "Data has been successfully written to buffer" if stored else "duplicate uid: already stored"
        return 200, {"success": True, "message": message, "data": {"data": [], "meta_info": self.store.counts()}}

    def get_rollout_data(self, body: Any) -> tuple[int, dict[str, Any]]:
        result = self.store.take_ready(self.task())
        result["meta_info"]["task_errors"] = list(self.task_errors)
        n = len(result["data"])
        message = f"Successfully read {n} items" if n else "No data available to read"
        return 200, {"success": bool(n), "message": message, "data": result}


def check_binding(host: str, token: str | None) -> None:
    """Refuse to serve off loopback without a bearer token."""
    if not is_loopback(host) and not token:
        raise ValueError(f"binding the rollout buffer to {host} needs a bearer token (--token or ${TOKEN_ENV})")


def make_buffer_server(service: BufferService, host: str = "127.0.0.1", port: int = 8889, *,
                       token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> ThreadingHTTPServer:
    """The HTTP server of ``service`` (call ``serve_forever``). Off loopback a ``token`` is required."""
    check_binding(host, token)
    routes = {"/start_rollout": service.start_rollout, "/buffer/write": service.write,
              "/get_rollout_data": service.get_rollout_data}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            if token and not token_matches(self.headers.get("Authorization"), token):
                return self._reply(401, {"success": False, "message": "missing or wrong bearer token"})
            if self.headers.get("Origin") is not None:
                return self._reply(403, {"success": False, "message": "requests from web pages are refused"})
            if self.headers.get("Content-Type") and not is_json(self.headers.get("Content-Type")):
                return self._reply(415, {"success": False, "message": "Content-Type must be application/json"})
            route = routes.get(self.path.split("?")[0])
            if route is None:
                return self._reply(404, {"success": False, "message": f"no endpoint {self.path}; use {', '.join(routes)}"})
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                return self._reply(400, {"success": False, "message": "bad Content-Length"})
            if length > max_body:
                self.close_connection = True
                return self._reply(413, {"success": False, "message": f"body of {length} bytes is over the {max_body}-byte limit"})
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return self._reply(400, {"success": False, "message": f"body is not JSON: {exc}"})
            self._reply(*route(body))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    service.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{server.server_address[1]}"
    return server
