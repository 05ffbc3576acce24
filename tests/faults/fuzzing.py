"""The fuzz harness for rlsdk's HTTP services, over real HTTP on loopback: every route of an aiohttp app
(read from its router, so a route added later is fuzzed without a word here), hypothesis-drawn requests
(methods, paths, headers, bodies of every JSON type, depths, encodings and costly sizes), and the checks
each answer must pass: never a 500, the server's event loop never stalled over :data:`MAX_STALL` seconds,
and the service's peak memory grown by less than :data:`MAX_GROWTH_MB`.

The service runs in a process of its own (``fuzz_target.py``: add a kind there for a new service), so
the test's own work is never counted as the service's. A new service's test (see ``test_fuzz_services.py``)
is then::

    with FuzzTarget("engine", tmp_path) as target:
        fuzz(target, seeds=[...], examples=list(costly_examples(target.routes)))

Example counts are modest and derandomized (the same examples every run) so the suite's time is fixed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_STALL = 1.0
"""Seconds the server's event loop may run late at most (one request's work blocking every other)."""
MAX_GROWTH_MB = 400
"""Growth of the service process's peak resident memory a whole fuzz run may cause."""
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=True,
)
REFUSED = (401, 403, 415, 421)
"""What a request without the token (or from a web page) gets from a guarded service."""


def routes_of(app: Any, **path_values: str) -> list[tuple[str, str]]:
    """``(method, path)`` of every route of an aiohttp ``app``, a variable part ``{name}`` filled with
    ``path_values[name]`` (``"x"`` when not given)."""
    routes = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if path is None:
            continue
        for name in info.get("pattern").groupindex if "pattern" in info else ():
            path = path.replace("{" + name + "}", path_values.get(name, "x"))
        routes.append(("POST" if route.method == "*" else route.method, path))
    return sorted(set(routes))


class LoopWatch:
    """How late an event loop ran a 10 ms timer at worst, measured on that loop while the block runs: the
    lateness, but no more than the CPU time the process spent meanwhile, so a process the machine did not
    run (two cores shared by a test suite) is not taken for one busy with a request."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.worst = 0.0
        self._future: Any = None

    async def _watch(self) -> None:
        while True:
            started, cpu = self.loop.time(), time.process_time()
            await asyncio.sleep(0.01)
            late = self.loop.time() - started - 0.01
            self.worst = max(self.worst, min(late, time.process_time() - cpu))

    def __enter__(self) -> LoopWatch:
        self._future = asyncio.run_coroutine_threadsafe(self._watch(), self.loop)
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._future.cancel()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**400)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)

COSTLY_SIZES = [2_000, 100_000, 800_000]
"""Element counts of the costly bodies: small, large, and (the explicit examples) over the value budget of
every route but the chat routes' characters (bodies of up to 6 MB)."""


def costly_body(shape: str, n: int) -> bytes:
    """A body whose cost lies in its size: ``n`` tiny values, blocks or levels of one ``shape``."""
    if shape == "numbers":  # a tool schema's enum of numbers (the 21 MB request of issue 47)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                "properties": {"x": {"enum": [1] * n}}}}}  # fmt: skip
        body = {"messages": [{"role": "user", "content": "w1"}], "tools": [tool], "input_ids": [1] * 4}
        return json.dumps(body).encode()
    if shape == "lists":
        return ("[" + ",".join(["[[]]"] * n) + "]").encode()
    if shape == "blocks":  # Anthropic text blocks, joined by the server (at most 6 MB of them)
        blocks = ",".join(['{"type":"text","text":"w1 "}'] * min(n, 200_000))
        return f'{{"max_tokens":1,"messages":[{{"role":"user","content":[{blocks}]}}]}}'.encode()
    if shape == "string":
        return json.dumps({"text": "w1 " * n, "messages": [{"role": "user", "content": "w1 " * n}]}).encode()
    if shape == "deep":
        depth = min(n, 100_000)
        return ("[" * depth + "]" * depth).encode()
    raise ValueError(shape)


COSTLY_SHAPES = ["numbers", "lists", "blocks", "string", "deep"]


@st.composite
def bodies(draw: Any, seeds: list[dict[str, Any]]) -> bytes:
    """A seed body with some of its values replaced, random JSON, random bytes, JSON in another encoding,
    or a costly body."""
    kind = draw(st.sampled_from(["mutated", "mutated", "json", "bytes", "encoded", "costly"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "costly":
        return costly_body(draw(st.sampled_from(COSTLY_SHAPES)), draw(st.sampled_from(COSTLY_SIZES[:-1])))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    body = dict(draw(st.sampled_from(seeds)))
    for key in draw(
        st.lists(st.sampled_from([*body, "stream", "n", "tools", "sampling_params"]), max_size=3)
    ):
        body[key] = draw(json_values)
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    if kind == "encoded":
        return text.encode(draw(st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "latin-1"])), "replace")
    return text.encode()


QUERY_NAMES = [
    "q",
    "limit",
    "offset",
    "sort",
    "step",
    "file",
    "dataset",
    "status",
    "since",
    "a",
    "b",
    "token",
]
"""Query parameters services read (the viewer's among them), drawn beside random names."""
query_values = (
    st.text(max_size=40)
    | st.integers(min_value=-(10**30), max_value=10**30).map(str)
    | st.sampled_from(["nan", "inf", "-1", "", "%00", "../../etc/passwd", "x" * 3000])
)


@st.composite
def requests(draw: Any, routes: list[tuple[str, str]], seeds: list[dict[str, Any]]) -> tuple:
    """Mostly requests to the service's own routes that pass the guard (so that the handlers are fuzzed),
    some to other paths and methods, with headers that do not; GET routes with query strings."""
    method, path = draw(st.sampled_from(routes))
    if draw(st.integers(0, 5)) == 0:
        path = "/" + draw(st.text(alphabet="/abcxyz_.%0123456789", min_size=0, max_size=30)).lstrip("/")
        method = draw(st.sampled_from(["POST", "GET", "DELETE", "PUT"]))
    if method in ("GET", "HEAD") and draw(st.booleans()):
        names = st.sampled_from(QUERY_NAMES) | st.text(min_size=1, max_size=10)
        params = draw(st.lists(st.tuples(names, query_values), max_size=5))
        path += "?" + urlencode(params)
    headers = {}
    if draw(st.integers(0, 3)) == 0:
        headers["Content-Type"] = draw(
            st.sampled_from(
                ["text/plain", "application/json; charset=utf-8", "application/json; charset=utf-16", "x/y"]
            )
        )
    if draw(st.integers(0, 3)) == 0:
        headers["Authorization"] = draw(st.sampled_from(["Bearer x", "Basic abc", ""]))
    if draw(st.integers(0, 4)) == 0:
        headers["Host"] = draw(
            st.sampled_from(["localhost", "evil.example", "[::1]:1", "127.0.0.1:80", "a b"])
        )
    return method, path, headers, draw(bodies(seeds))


def send(
    client: httpx.Client, url: str, request: tuple, default_headers: dict[str, str] | None = None
) -> httpx.Response:
    """One request; ``default_headers`` (the service's token) where the request sets none of them."""
    method, path, headers, body = request
    headers = {**(default_headers or {}), **headers}
    return client.request(
        method, url + path, content=body if method not in ("GET", "HEAD") else None, headers=headers
    )


class FuzzTarget:
    """A service served by ``fuzz_target.py`` in a process of its own (``kind``: ``engine``, ``chat``,
    ``buffer``, ``view`` or ``tinker``; with ``token`` it needs it, sent with every request with
    ``send_token``): ``url``, ``routes``, and :meth:`ask` for its stall, memory and state."""

    def __init__(
        self, kind: str, folder: Path, token: str | None = None, *, send_token: bool = False
    ) -> None:
        script = Path(__file__).with_name("fuzz_target.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), kind, str(folder), token or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not first:
            raise AssertionError(f"the {kind} fuzz target did not start (exit {self.proc.wait()})")
        started = json.loads(first)
        self.url: str = started["url"]
        self.routes: list[tuple[str, str]] = [tuple(r) for r in started["routes"]]  # type: ignore[misc]
        self.start_mb = self.ask()["peak_mb"]
        self.headers = (
            ({"X-API-Key": token} if kind == "tinker" else {"Authorization": f"Bearer {token}"})
            if send_token
            else {}
        )
        """Sent with each request that sets no header of its own of that name."""

    def ask(self) -> dict[str, Any]:
        """``{"stall", "peak_mb", "state"}``: the loop's worst lateness since the last ask, and so on."""
        self.proc.stdin.write("\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"the fuzz target died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> FuzzTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fuzz(
    target: FuzzTarget,
    *,
    seeds: list[dict[str, Any]],
    check: Any = None,
    examples: list[tuple] = (),  # type: ignore[assignment]
) -> None:
    """Send ``examples``, then hypothesis-drawn requests to every route of ``target`` under :data:`FUZZ`:
    each answered below 500 within 60 s (or as ``check(request, answer)`` says), the service's loop never
    late by :data:`MAX_STALL` or more, and its peak memory grown by less than :data:`MAX_GROWTH_MB`."""
    with httpx.Client(timeout=60) as client:

        def one(request: tuple) -> None:
            answer = send(client, target.url, request, target.headers)
            if check is not None:
                check(request, answer)
            else:
                assert answer.status_code < 500, (request[:3], answer.status_code, answer.text[:300])
            stall = target.ask()["stall"]
            assert stall < MAX_STALL, (request[:3], len(request[3]), f"the loop stalled {stall:.2f}s")

        for request in examples:
            one(request)
        FUZZ(given(requests(target.routes, seeds))(one))()
    grown = target.ask()["peak_mb"] - target.start_mb
    assert grown < MAX_GROWTH_MB, f"the service's peak memory grew {grown:.0f} MB"


def costly_examples(routes: list[tuple[str, str]]) -> Iterator[tuple]:
    """Every costly shape at its largest size to every POST route: always sent, whatever hypothesis draws."""
    for method, path in routes:
        if method == "POST":
            for shape in COSTLY_SHAPES:
                yield method, path, {}, costly_body(shape, COSTLY_SIZES[-1])
