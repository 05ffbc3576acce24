"""The ``rlsdk view`` server: the page (HTML, JavaScript and CSS shipped in this package, nothing fetched
from elsewhere) and a read-only JSON API over the run folders named when it starts.

The rules of every rlsdk service (:mod:`rlsdk.engines.service_guard`) apply, and a few of its own:

- A token is always required, loopback or not: the printed URL carries it (``/?token=...``); that first
  request sets a cookie for this port (``HttpOnly``, ``SameSite=Strict``) and redirects to the page
  without it, so the token leaves the address bar. Programs may send ``Authorization: Bearer <token>``.
- Only ``GET`` (and ``HEAD``); every parameter is checked (an unknown one, a value out of range, a text
  too long: 400); a run, step, sample file or line is a number or a name from a fixed list, never a path:
  the only files read are the run folders' own (and each run's tokenizer, named by its saved settings).
- Pages are served with a content security policy that allows only this server's own scripts and styles,
  and the page puts sample text in the document as text, never as markup.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from ..engines.service_guard import (
    ConnectionLimits,
    FailedAuthLimiter,
    Served,
    check_binding,
    guard,
    token_matches,
)
from .compare import COMPARE_SORTS, compare
from .runs import SAMPLE_FILES, RunFolder, ViewError
from .samples import MAX_QUERY_CHARS, SORTS, Filters

VIEW_TOKEN_ENV = "RLSDK_VIEW_TOKEN"
"""The environment variable ``rlsdk view --token`` reads."""
MAX_PAGE = 200
"""The most rows one request returns."""
MAX_STEP = 10**9
"""Larger step numbers are refused before any lookup."""
STATIC_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_RUNS = web.AppKey("runs", list)


class BadParameter(ValueError):
    """A request's parameter that is unknown, of the wrong type or out of range (400)."""


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the package: name -> (content, content type)."""
    folder = resources.files(__package__ or "rlsdk.view") / "static"
    out = {}
    for item in folder.iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in STATIC_TYPES:
            out[item.name] = (item.read_bytes(), STATIC_TYPES[suffix])
    return out


class Query:
    """A request's query parameters, each read once and checked; :meth:`done` refuses any left over."""

    def __init__(self, query: Mapping[str, str]) -> None:
        self._values = dict(query)
        if len(self._values) != len(query):
            raise BadParameter("a parameter is given twice")

    def text(self, name: str, limit: int = MAX_QUERY_CHARS) -> str | None:
        value = self._values.pop(name, None)
        if value is not None and len(value) > limit:
            raise BadParameter(f"{name} is longer than {limit} characters")
        return value or None

    def choice(self, name: str, choices: Sequence[str], default: str | None = None) -> str | None:
        value = self.text(name)
        if value is None:
            return default
        if value not in choices:
            raise BadParameter(f"{name} must be one of {', '.join(choices)}, got {value[:50]!r}")
        return value

    def count(self, name: str, low: int, high: int, default: int) -> int:
        value = self.integer(name, low, high)
        return default if value is None else value

    def integer(self, name: str, low: int, high: int) -> int | None:
        value = self.text(name, 20)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            raise BadParameter(f"{name} must be a whole number, got {value!r}") from None
        if not low <= number <= high:
            raise BadParameter(f"{name} must be between {low} and {high}, got {number}")
        return number

    def number(self, name: str) -> float | None:
        value = self.text(name, 40)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            raise BadParameter(f"{name} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise BadParameter(f"{name} must be a finite number, got {value!r}")
        return number

    def done(self) -> None:
        if self._values:
            raise BadParameter(f"unknown parameters: {', '.join(sorted(self._values))[:200]}")


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity as None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def reply(value: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(finite(value), separators=(",", ":")), status=status, content_type="application/json"
    )


def error(message: str, status: int) -> web.Response:
    return reply({"error": message}, status)


def path_int(request: web.Request, name: str, low: int, high: int) -> int:
    value = int(request.match_info[name])  # the route's pattern admits only digits (and a leading -)
    if not low <= value <= high:
        raise BadParameter(f"{name} must be between {low} and {high}, got {value}")
    return value


def run_of(request: web.Request, name: str = "run", value: int | None = None) -> RunFolder:
    runs: list[RunFolder] = request.app[_RUNS]
    number = path_int(request, name, 0, len(runs) - 1) if value is None else value
    run = runs[number]
    run.refresh()
    return run


@dataclass
class ViewServer(Served):
    """A running viewer: :attr:`url` opens it (with its token); ``await close()`` stops it."""

    token: str

    @property
    def url(self) -> str:
        return f"{self.base}/?token={self.token}"


def cookie_name(port: int) -> str:
    """Cookies are shared by every port of a host: each viewer's carries its port in its name."""
    return f"rlsdk_view_{port}"


def authorize(token: str, port: list[int]) -> Any:
    """The token check (see the module's docstring): the bearer header, this port's cookie, or the token in
    the page's URL, which sets the cookie and redirects."""
    failures = FailedAuthLimiter()

    @web.middleware
    async def authorized(request: web.Request, handler: Any) -> web.StreamResponse:
        name = cookie_name(port[0])
        cookie = request.cookies.get(name, "")
        if token_matches(request.headers.get("Authorization"), token) or hmac.compare_digest(
            cookie.encode(), token.encode()
        ):
            return await handler(request)
        given = request.query.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.encode()) and request.path == "/":
            # to the page without the token; the browser keeps the #fragment (the page within the viewer)
            response = web.Response(status=302, headers={"Location": "/"})
            response.set_cookie(name, token, httponly=True, samesite="Strict", path="/")
            return response
        await asyncio.sleep(failures.delay())
        if request.path.startswith("/api/"):
            return error("missing or wrong token: open the URL rlsdk view printed", 401)
        return web.Response(
            status=401,
            text="rlsdk view: open the URL that `rlsdk view` printed (it carries the token).\n",
            content_type="text/plain",
        )

    return authorized


@web.middleware
async def headers(request: web.Request, handler: Any) -> web.StreamResponse:
    """Security headers on every answer; a request the run cannot answer, or with a bad parameter, gets
    its reason as JSON."""
    try:
        response = await handler(request)
    except BadParameter as exc:
        response = error(str(exc), 400)
    except ViewError as exc:
        response = error(str(exc), 404)
    except web.HTTPNotFound:
        response = error(f"no such page: {request.path[:100]}", 404)
    except web.HTTPMethodNotAllowed:
        response = error(f"{request.method} is not allowed: the viewer only reads", 405)
    for key, value in SECURITY_HEADERS.items():
        response.headers.setdefault(key, value)
    return response


async def start_view(
    runs: list[RunFolder],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str,
    allowed_hosts: Sequence[str] = (),
    max_connections: int = 64,
) -> ViewServer:
    """Serve ``runs`` (read once before it listens) on ``host:port`` (0: a free port)."""
    check_binding("rlsdk view", host, token, VIEW_TOKEN_ENV)
    for run in runs:
        run.refresh()
    limits = ConnectionLimits(
        max_body=4096, read_timeout=10.0, idle_timeout=120.0, max_connections=max_connections
    )
    bound: list[int] = [port]  # the cookie's name needs the port, known once listening
    app = limits.app(
        [
            headers,  # outermost: on every answer, refusals included
            guard(None, error, bind_host=host, allowed_hosts=allowed_hosts),
            authorize(token, bound),
        ],
        error,
    )
    app[_RUNS] = runs
    files = static_files()

    async def page(request: web.Request) -> web.Response:
        content, kind = files["index.html"]
        return web.Response(body=content, content_type=kind, charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None or found[1] == "text/html":
            raise web.HTTPNotFound()
        return web.Response(body=found[0], content_type=found[1], charset="utf-8")

    run_id = r"{run:\d{1,6}}"
    app.add_routes(
        [
            web.get("/", page),
            web.get("/static/{name}", static),
            web.get("/api/runs", list_runs),
            web.get(f"/api/runs/{run_id}", run_summary),
            web.get(f"/api/runs/{run_id}/metrics", run_metrics),
            web.get(f"/api/runs/{run_id}/evals", run_evals),
            web.get(f"/api/runs/{run_id}/steps/{{step:-?\\d{{1,10}}}}", run_step),
            web.get(f"/api/runs/{run_id}/samples", run_samples),
            web.get(f"/api/runs/{run_id}/samples/{{file:[a-z]{{1,20}}}}/{{n:\\d{{1,12}}}}", run_sample),
            web.get("/api/compare", run_compare),
        ]
    )
    runner, bound[0] = await limits.serve(app, host, port, handler_cancellation=False)
    return ViewServer(host=host, port=bound[0], token=token, runner=runner, limits=limits)


async def list_runs(request: web.Request) -> web.Response:
    Query(request.query).done()
    runs: list[RunFolder] = request.app[_RUNS]
    for run in runs:
        run.refresh()
    return reply({"runs": [run.overview() for run in runs]})


async def run_summary(request: web.Request) -> web.Response:
    Query(request.query).done()
    return reply(run_of(request).summary())


async def run_metrics(request: web.Request) -> web.Response:
    query = Query(request.query)
    since = query.count("since", 0, 10**9, 0)
    query.done()
    return reply(run_of(request).metric_rows(since))


async def run_evals(request: web.Request) -> web.Response:
    Query(request.query).done()
    return reply(run_of(request).eval_rows())


async def run_step(request: web.Request) -> web.Response:
    query = Query(request.query)
    offset = query.count("offset", 0, 10**9, 0)
    limit = query.count("limit", 1, MAX_PAGE, 50)
    query.done()
    run = run_of(request)
    step = path_int(request, "step", -1, MAX_STEP)
    return reply(run.step(step, offset, limit))


async def run_samples(request: web.Request) -> web.Response:
    query = Query(request.query)
    file = query.choice("file", tuple(SAMPLE_FILES), "rollouts") or "rollouts"
    filters = Filters(
        step=query.integer("step", -1, MAX_STEP),
        group=query.integer("group", -1, 2**31 - 1),
        min_reward=query.number("min_reward"),
        max_reward=query.number("max_reward"),
        min_length=query.integer("min_length", 0, 2**31 - 1),
        max_length=query.integer("max_length", 0, 2**31 - 1),
        status=query.text("status", 40),
        reason=query.text("reason", 200),
        dataset=query.text("dataset", 200),
        text=query.text("q"),
    )
    order = query.choice("sort", SORTS, "order") or "order"
    offset = query.count("offset", 0, 10**9, 0)
    limit = query.count("limit", 1, MAX_PAGE, 50)
    query.done()
    return reply(run_of(request).search(file, filters, order, offset, limit))


async def run_sample(request: web.Request) -> web.Response:
    Query(request.query).done()
    file = request.match_info["file"]
    if file not in SAMPLE_FILES:
        raise BadParameter(f"the sample file must be one of {', '.join(SAMPLE_FILES)}, got {file!r}")
    run = run_of(request)
    return reply(run.sample(file, path_int(request, "n", 0, 10**12)))


async def run_compare(request: web.Request) -> web.Response:
    query = Query(request.query)
    runs: list[RunFolder] = request.app[_RUNS]
    last = len(runs) - 1
    a = query.count("a", 0, last, 0)
    b = query.count("b", 0, last, last)
    step_a = query.integer("step_a", -1, MAX_STEP)
    step_b = query.integer("step_b", -1, MAX_STEP)
    dataset = query.text("dataset", 200)
    order = query.choice("sort", COMPARE_SORTS, "delta") or "delta"
    offset = query.count("offset", 0, 10**9, 0)
    limit = query.count("limit", 1, MAX_PAGE, 50)
    query.done()
    left, right = run_of(request, value=a), run_of(request, value=b)
    return reply(compare(left, right, step_a, step_b, dataset, order, offset, limit))
