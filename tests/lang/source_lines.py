"""Shared by the language tests: the line of a test file that a marker comment names, so an
error's reported line is checked against the source without hard-coding numbers."""
from __future__ import annotations


def marked_line(path: str, marker: str) -> int:
    """The number of the first line of `path` holding `marker`, skipping the lines that only
    look it up (calls of line_of / expect)."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line and "expect(" not in line:
                return n
    raise AssertionError(f"no line of {path} holds the marker {marker!r}")
