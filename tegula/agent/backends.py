"""Model backends behind one interface: `complete(messages, kind) -> reply text`.

* `OpenAIBackend` — any OpenAI-compatible chat-completions endpoint (`--endpoint URL`,
  `--model NAME`, the key from an environment variable, `OPENAI_API_KEY` by default),
  over the standard library's `urllib` (no new dependency).
* `ReplayBackend` — plays recorded replies in order, so the whole loop runs offline
  (CI has no network). It reads a replay file (below) or a run directory's
  `transcript.jsonl` (every run records one), and checks that each recorded reply
  answers the kind of prompt the loop is asking now (generate, diagnose, repair,
  optimize): a loop that diverges from the recording fails loudly instead of feeding
  a repair to an optimization prompt.

A replay file is plain text: a reply starts at a line `=== reply: KIND ===` and runs to
the next such line; lines before the first header are a comment. Replies written by hand
for tests are exactly that — hand-written, not model output — and the run records say
which backend produced every reply.
"""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Protocol

KINDS = ("generate", "diagnose", "repair", "optimize")
_REPLY_HEADER = re.compile(r"^=== reply: (\w+) ===\s*$", re.M)


class BackendError(Exception):
    """The model could not be asked (network, HTTP, an exhausted or diverging replay)."""


class Backend(Protocol):
    """What the loop needs from a model."""

    name: str

    def complete(self, messages: list[dict], kind: str) -> str: ...


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint."""

    def __init__(self, endpoint: str, model: str, key_env: str = "OPENAI_API_KEY",
                 temperature: float = 0.2, timeout: float = 600.0) -> None:
        self.url = endpoint.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        self.model, self.temperature, self.timeout = model, temperature, timeout
        self.key = os.environ.get(key_env, "")
        self.name = f"openai-compatible {self.url} model {model}"

    def complete(self, messages: list[dict], kind: str) -> str:
        body = json.dumps({"model": self.model, "messages": messages,
                           "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read().decode())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise BackendError(f"{self.url}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise BackendError(f"{self.url}: {getattr(err, 'reason', err)}") from None
        except ValueError as err:
            raise BackendError(f"{self.url}: the reply is not JSON: {err}") from None
        try:
            return payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.url}: no choices[0].message.content in the reply: "
                               f"{str(payload)[:300]}") from None


class ReplayBackend:
    """Recorded replies, played in order."""

    def __init__(self, replies: list[tuple[str, str]], source: str = "replay") -> None:
        self.replies = list(replies)
        self.position = 0
        self.name = f"replay of {source}"

    @classmethod
    def from_path(cls, path: str) -> "ReplayBackend":
        """A replay file, or a run directory (its transcript.jsonl)."""
        if os.path.isdir(path):
            path = os.path.join(path, "transcript.jsonl")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise BackendError(f"cannot read the replay {path}: {err.strerror}") from None
        if path.endswith(".jsonl"):
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
            return cls([(r["kind"], r["reply"]) for r in records], path)
        return cls(parse_replay(text, path), path)

    def complete(self, messages: list[dict], kind: str) -> str:
        if self.position >= len(self.replies):
            raise BackendError(f"{self.name}: the recording has {len(self.replies)} replies; "
                               f"the loop asked for a {kind} reply after the last")
        recorded_kind, reply = self.replies[self.position]
        if recorded_kind != kind:
            raise BackendError(f"{self.name}: reply {self.position + 1} was recorded for a "
                               f"{recorded_kind} prompt, but the loop asks for {kind} (the "
                               f"run diverged from the recording)")
        self.position += 1
        return reply


def parse_replay(text: str, where: str = "replay") -> list[tuple[str, str]]:
    """`=== reply: KIND ===` sections of a replay file, as (kind, text) pairs."""
    headers = list(_REPLY_HEADER.finditer(text))
    if not headers:
        raise BackendError(f"{where}: no '=== reply: KIND ===' lines")
    replies = []
    for header, following in zip(headers, headers[1:] + [None]):
        kind = header.group(1)
        if kind not in KINDS:
            raise BackendError(f"{where}: unknown reply kind {kind!r} (known: {', '.join(KINDS)})")
        end = following.start() if following else len(text)
        replies.append((kind, text[header.end():end].strip("\n") + "\n"))
    return replies


__all__ = ["Backend", "BackendError", "OpenAIBackend", "ReplayBackend", "parse_replay", "KINDS"]
