"""Serve a BM25 index over HTTP with Search-R1's ``POST /retrieve`` shape (``search-r1-retriever``)."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import CORPUS
from .bm25 import BM25Index

MAX_BODY = 1 << 20


def retrieve_body(index: BM25Index, body: Any) -> dict[str, Any]:
    """Answer one ``/retrieve`` body; a malformed one raises ValueError with the reason."""
    if not isinstance(body, dict) or not isinstance(body.get("queries"), list):
        raise ValueError('expected {"queries": [str, ...], "topk": int, "return_scores": bool}')
    if not all(isinstance(q, str) for q in body["queries"]):
        raise ValueError("every query must be a string")
    topk = 3 if body.get("topk") is None else body["topk"]
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive integer, got {topk!r}")
    results = []
    for query in body["queries"]:
        hits = index.search(query, topk)
        if body.get("return_scores"):
            results.append([{"document": doc, "score": score} for doc, score in hits])
        else:
            results.append([doc for doc, _ in hits])
    return {"result": results}


def make_server(index: BM25Index, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) answering ``POST /retrieve`` from ``index``."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path != "/retrieve":
                return self._reply(404, {"error": f"no endpoint {self.path}; use POST /retrieve"})
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self._reply(413, {"error": f"body over {MAX_BODY} bytes"})
            try:
                self._reply(200, retrieve_body(index, json.loads(self.rfile.read(length) or b"null")))
            except (ValueError, json.JSONDecodeError) as exc:
                self._reply(400, {"error": str(exc)})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


def serve_in_thread(
    index: BM25Index, host: str = "127.0.0.1", port: int = 0
) -> tuple[ThreadingHTTPServer, str]:
    """Start serving in a daemon thread; returns the server (``shutdown()`` stops it) and its URL."""
    server = make_server(index, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a BM25 index with Search-R1's /retrieve API.")
    parser.add_argument("--corpus", default=str(CORPUS), help="JSONL passages {id, contents}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    server = make_server(BM25Index.from_jsonl(options.corpus), options.host, options.port)
    print(
        f"serving {options.corpus} on http://{options.host}:{server.server_address[1]}/retrieve", flush=True
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
