"""Errors a kernel author sees.

`TegulaError` is the base of every error the compiler raises on bad input. Errors that come
from a traced kernel carry the user's source location (file, line, source text), so the
message points at the line of the kernel that caused it rather than at compiler internals.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.layout.errors import LayoutError


@dataclass(frozen=True)
class SourceLocation:
    """Where in the user's kernel source an op was written."""

    filename: str
    lineno: int
    line: str = ""
    function: str = ""

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno}"
        if self.function:
            where += f" in {self.function}"
        if self.line:
            where += f"\n    {self.line.strip()}"
        return where


def call_site() -> SourceLocation | None:
    """The innermost caller outside tegula's compiler and runtime: the user's launch,
    `tg.emulate`, `trace` or `explain` call (where the user can fix what was passed). The
    kernel library (`tegula/kernels`) counts as a user."""
    import linecache
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    library = os.path.join(package, "kernels") + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(package) or filename.startswith(library):
            return SourceLocation(filename, frame.f_lineno,
                                  linecache.getline(filename, frame.f_lineno).strip(),
                                  frame.f_code.co_name)
        frame = frame.f_back
    return None


class TegulaError(Exception):
    """A kernel, or its inputs, cannot be compiled or run as written.

    `loc` (and optionally `other_loc`) say which line(s) of the user's kernel are involved.
    """

    def __init__(self, message: str, loc: SourceLocation | None = None,
                 other_loc: SourceLocation | None = None):
        self.message = message
        self.loc = loc
        self.other_loc = other_loc
        text = message
        if loc is not None:
            text += f"\n  at {loc}"
        if other_loc is not None:
            text += f"\n  and at {other_loc}"
        super().__init__(text)


class ClusterWarning(UserWarning):
    """A kernel declares a thread-block cluster (`tg.cluster`) that multicasts nothing for
    this build: correct, but the blocks gain nothing from it (`synth/multicast.py`)."""


class TraceError(TegulaError):
    """The kernel body used the language wrongly (shapes, dtypes, ranks, arguments)."""


class SynthesisError(TegulaError):
    """No layout or instruction assignment satisfies the kernel's constraints."""


class ResourceError(TegulaError):
    """The kernel needs more of a resource (shared memory, registers, threads) than the target has."""


class CompileError(TegulaError):
    """The CUDA compiler rejected the generated source (a tegula bug: please report it)."""


class LaunchError(TegulaError):
    """The arguments given at launch do not match the kernel's signature."""


__all__ = ["SourceLocation", "call_site", "TegulaError", "TraceError", "SynthesisError", "ResourceError",
           "CompileError", "LaunchError", "LayoutError"]
