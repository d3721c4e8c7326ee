"""Reply parsing (whole modules, numbered-line edits) and the model backends: the
OpenAI-compatible one against a local HTTP server on 127.0.0.1 (no outside network), the
replay one from files."""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from tegula.agent.backends import BackendError, OpenAIBackend, ReplayBackend, parse_replay
from tegula.agent.edits import (EditError, apply_edits, code_block, kernel_from_reply,
                                numbered, parse_edits)

SOURCE = "a\nb\nc\nd\ne\n"


def edit(text: str, source: str = SOURCE) -> str:
    return apply_edits(source, parse_edits(text))


def test_edits_refer_to_the_original_numbering():
    assert edit("@@ replace 2-3\nB\nC\nC2\n@@ insert 0\ntop\n@@ insert 5\nend\n@@ delete 4") \
        == "top\na\nB\nC\nC2\ne\nend\n"
    assert edit("@@ insert 3\nafter c\n@@ replace 4\nD") == "a\nb\nc\nafter c\nD\ne\n"


@pytest.mark.parametrize("text, message", [
    ("@@ replace 2-7\nx", "outside the kernel's lines 1-5"),
    ("@@ replace 2-3\nx\n@@ delete 3", "overlap"),
    ("@@ replace 2-4\nx\n@@ insert 3\ny", "falls inside"),
    ("@@ delete 2\nleftover", "carries lines"),
    ("replace 2\nx", "text before the first @@"),
    ("", "no @@"),
])
def test_bad_edits_are_named(text, message):
    with pytest.raises(EditError, match=message):
        edit(text)


def test_replies_whole_or_edits():
    assert numbered("x\ny\n") == "1 | x\n2 | y"
    reply = "Here:\n```python\nfirst\n```\nbetter:\n```python\nsecond\n```\n"
    assert code_block(reply) == "second\n"
    assert kernel_from_reply(reply, SOURCE) == ("second\n", "whole")
    assert kernel_from_reply("```edits\n@@ delete 1-4\n```", SOURCE) == ("e\n", "edits")
    with pytest.raises(EditError, match="neither"):
        kernel_from_reply("no code here", SOURCE)


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802 — http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append((self.path, self.headers.get("Authorization"), body))
        if body["model"] == "broken":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        reply = {"choices": [{"message": {"content": f"echo {body['messages'][-1]['content']}"}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_openai_compatible_backend(server, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "sk-test")
    backend = OpenAIBackend(server, "some-model", key_env="TEST_KEY")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert backend.complete(messages, "generate") == "echo hi"
    path, auth, body = _Handler.seen[-1]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body["model"] == "some-model" and body["messages"] == messages
    with pytest.raises(BackendError, match="HTTP 500: overloaded"):
        OpenAIBackend(server, "broken").complete(messages, "generate")


def test_unreachable_endpoint_is_a_backend_error():
    with pytest.raises(BackendError, match="127.0.0.1:9"):
        OpenAIBackend("http://127.0.0.1:9/v1", "m", timeout=5).complete([], "generate")


def test_replay_files(tmp_path):
    text = "comment\n=== reply: generate ===\nA\n```python\nx\n```\n=== reply: diagnose ===\nB\n"
    assert parse_replay(text) == [("generate", "A\n```python\nx\n```\n"), ("diagnose", "B\n")]
    with pytest.raises(BackendError, match="unknown reply kind"):
        parse_replay("=== reply: chat ===\nx")
    path = tmp_path / "r.txt"
    path.write_text(text)
    backend = ReplayBackend.from_path(str(path))
    assert backend.complete([], "generate").startswith("A")
    assert backend.complete([], "diagnose") == "B\n"
    with pytest.raises(BackendError, match="after the last"):
        backend.complete([], "repair")
