"""The remote reward against a real HTTP server on loopback that injects delays, 500s, 4xx, malformed
JSON and dropped connections."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlsdk import Sample
from rlsdk import REWARD_ERROR
from rlsdk.testing import score


class Handler(BaseHTTPRequestHandler):
    counts: dict = {}

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = self.path
        Handler.counts[path] = Handler.counts.get(path, 0) + 1
        attempt = Handler.counts[path]
        if path == "/drop" and attempt == 1:
            self.connection.close()  # no response at all
            return
        if path == "/flaky" and attempt <= 2 or path == "/always500":
            return self._reply(500, b"boom")
        if path == "/bad-request":
            return self._reply(400, b"bad")
        if path == "/malformed":
            return self._reply(200, b"{not json")
        if path == "/slow":
            time.sleep(0.5)
        if path == "/dict":
            return self._reply(200, json.dumps({"score": 1.0, "echo": body}).encode())
        return self._reply(200, json.dumps(float(body["response"] == body["label"])).encode())

    def _reply(self, code, payload):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except BrokenPipeError:  # the client gave up (the timeout test)
            pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def run(pm, args, path, server, n=1, response="a", rm="remote"):
    Handler.counts.pop(path, None)
    samples = [Sample(group_index=0, index=i, prompt="p", response=response, label="a") for i in range(n)]
    score(pm, samples, args.replace(rm_type=rm, rm_url=server + path, rm_backoff=0.01))
    return samples


def test_float_and_both_names(hub_pm, args, server):
    assert [s.reward for s in run(hub_pm, args, "/ok", server, n=3)] == [1.0] * 3
    assert run(hub_pm, args, "/ok", server, response="b", rm="remote_rm")[0].reward == 0.0


def test_dict_reply_and_payload(hub_pm, args, server):
    reward = run(hub_pm, args, "/dict", server)[0].reward
    assert reward["echo"] == {"prompt": "p", "response": "a", "label": "a"}


def test_retries_500_then_succeeds(hub_pm, args, server):
    assert run(hub_pm, args, "/flaky", server)[0].reward == 1.0
    assert Handler.counts["/flaky"] == 3


def test_dropped_connection_is_retried(hub_pm, args, server):
    assert run(hub_pm, args, "/drop", server)[0].reward == 1.0


@pytest.mark.parametrize(
    "path,attempts,reason",
    [
        ("/always500", 4, "HTTP 500"),
        ("/bad-request", 1, "HTTP 400"),
        ("/malformed", 1, "malformed JSON"),
    ],
)
def test_failures_are_invalid(hub_pm, args, server, path, attempts, reason):
    sample = run(hub_pm, args, path, server)[0]
    assert sample.reward is None and sample.status is Sample.Status.FAILED
    assert reason in sample.metadata[REWARD_ERROR] and "remote" in sample.metadata[REWARD_ERROR]
    assert Handler.counts[path] == attempts


def test_request_timeout_then_invalid(hub_pm, args, server):
    sample = run(hub_pm, args.replace(rm_request_timeout=0.1, rm_retries=1), "/slow", server)[0]
    assert sample.reward is None and "Timeout" in sample.metadata[REWARD_ERROR]


def test_no_url_is_invalid_with_reason(hub_pm, args):
    sample = Sample(response="a", label="a")
    score(hub_pm, [sample], args.replace(rm_type="remote"))
    assert "rm_url" in sample.metadata[REWARD_ERROR]
