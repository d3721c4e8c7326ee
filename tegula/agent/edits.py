"""Reading a model's reply: a whole candidate (a ```python block) or structured edits of
numbered lines (an ```edits block), applied to the current kernel.

The edit format (line numbers are those of the numbered kernel the prompt showed; every
edit refers to the original numbering, so the order of edits does not matter):

    ```edits
    @@ replace 12-14
    <the new lines>
    @@ insert 20
    <lines inserted after line 20; `insert 0` puts them first>
    @@ delete 7-8
    ```

A range is `N` or `N-M`, inclusive. Overlapping edits, ranges outside the file, and
replies with neither block are errors the loop reports back to the model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"```(\w*)[^\n]*\n(.*?)```", re.S)
_HEADER = re.compile(r"@@\s*(replace|insert|delete)\s+(\d+)(?:\s*-\s*(\d+))?\s*$")


class EditError(Exception):
    """A reply that cannot be applied (named so the model can fix it)."""


@dataclass(frozen=True)
class Edit:
    """One edit: replace/delete lines first..last, or insert after line first."""

    op: str
    first: int
    last: int
    lines: tuple[str, ...] = ()


def numbered(source: str) -> str:
    """The source with 1-based line numbers, as prompts show it."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i + 1:>{width}} | {line}" for i, line in enumerate(lines))


def code_block(reply: str, language: str = "python") -> str | None:
    """The last fenced block of `language` in a reply (models put the final version last)."""
    blocks = [body for lang, body in _FENCE.findall(reply) if lang == language]
    return blocks[-1] if blocks else None


def parse_edits(text: str) -> list[Edit]:
    """The edits of an ```edits block's body."""
    edits: list[Edit] = []
    current: list | None = None
    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header:
            op, first = header.group(1), int(header.group(2))
            last = int(header.group(3)) if header.group(3) else first
            current = [op, first, last, []]
            edits.append(current)  # type: ignore[arg-type]
        elif current is not None:
            current[3].append(line)
        elif line.strip():
            raise EditError(f"text before the first @@ header in the edits block: {line!r}")
    result = [Edit(op, first, last, tuple(lines)) for op, first, last, lines in edits]
    if not result:
        raise EditError("the edits block holds no @@ replace/insert/delete header")
    return result


def apply_edits(source: str, edits: list[Edit]) -> str:
    """Apply edits (all numbered against `source`) and return the new source."""
    lines = source.splitlines()
    ranges = []
    for e in edits:
        if e.op == "insert":
            if not 0 <= e.first <= len(lines) or e.first != e.last:
                raise EditError(f"@@ insert {e.first}: expected one line number in "
                                f"0-{len(lines)}")
            continue
        if not 1 <= e.first <= e.last <= len(lines):
            raise EditError(f"@@ {e.op} {e.first}-{e.last}: outside the kernel's lines "
                            f"1-{len(lines)}")
        if e.op == "delete" and any(line.strip() for line in e.lines):
            raise EditError(f"@@ delete {e.first}-{e.last} carries lines; use replace")
        ranges.append(e)
    ranges.sort(key=lambda e: e.first)
    for a, b in zip(ranges, ranges[1:]):
        if b.first <= a.last:
            raise EditError(f"@@ {a.op} {a.first}-{a.last} and @@ {b.op} {b.first}-{b.last} "
                            f"overlap")
    for e in edits:
        inside = [r for r in ranges if r.first <= e.first < r.last]
        if e.op == "insert" and inside:
            raise EditError(f"@@ insert {e.first} falls inside @@ {inside[0].op} "
                            f"{inside[0].first}-{inside[0].last}")
    # Last position first, so earlier line numbers still point where they did; an insert
    # after line p sits between line p and line p + 1.
    for e in sorted(edits, key=lambda e: e.first + (0.5 if e.op == "insert" else 0),
                    reverse=True):
        if e.op == "insert":
            lines[e.first:e.first] = list(e.lines)
        elif e.op == "replace":
            lines[e.first - 1:e.last] = list(e.lines)
        else:
            del lines[e.first - 1:e.last]
    return "\n".join(lines) + "\n"


def kernel_from_reply(reply: str, current: str | None) -> tuple[str, str]:
    """(new source, how it was obtained) from a reply: edits of `current` when the reply
    has an ```edits block, else a whole ```python block."""
    edits = code_block(reply, "edits")
    if edits is not None and current is not None:
        return apply_edits(current, parse_edits(edits)), "edits"
    whole = code_block(reply, "python")
    if whole is not None:
        return whole, "whole"
    raise EditError("the reply has neither an ```edits block nor a ```python block")


__all__ = ["Edit", "EditError", "numbered", "code_block", "parse_edits", "apply_edits",
           "kernel_from_reply"]
