"""Comparing a candidate's output with the reference's, element by element.

The error of element i is normalized by the task's tolerance:

    e_i = |out_i - ref_i| / (atol * rms(ref) + rtol * |ref_i|)

and an output passes when every e_i <= 1 (atol is relative to the reference's rms, so one
tolerance serves inputs of any scale: the "wide" distribution multiplies them by up to
30). Shape and dtype must be exactly the reference's; NaN and infinities must sit where
the reference has them (with the same sign), never elsewhere. The worst elements are kept
for the report and for the agent's repair prompt.

A *degenerate* reference — all zero, constant, or not finite — would let a zeros or a
constant candidate pass; the evaluator refuses to judge against one and says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

WORST_SHOWN = 5


@dataclass
class Comparison:
    """The outcome of one output's check."""

    ok: bool
    reason: str = ""
    max_error: float = 0.0              # max normalized error (<= 1 passes)
    worst: list = field(default_factory=list)   # [(index tuple, got, expected, error)]


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float,
            what: str = "output") -> Comparison:
    """Check `out` against `ref` (see the module docstring)."""
    if out.shape != ref.shape:
        return Comparison(False, f"{what} has shape {tuple(out.shape)}, the reference "
                                 f"{tuple(ref.shape)}", float("inf"))
    if out.dtype != ref.dtype:
        return Comparison(False, f"{what} has dtype {out.dtype}, the reference {ref.dtype}",
                          float("inf"))
    if out.dtype.kind not in "fc":
        bad = out != ref
        return _summarize(out, ref, bad.astype(np.float64) * np.inf, what, exact=True)
    got, want = out.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(want)
    scale = _rms(want[finite])
    denominator = atol * scale + rtol * np.abs(want)
    with np.errstate(invalid="ignore", divide="ignore"):
        error = np.abs(got - want) / np.where(denominator > 0, denominator, np.inf)
        error = np.where(denominator > 0, error, np.where(got == want, 0.0, np.inf))
    # Non-finite reference values must be matched exactly (same NaN / same-signed inf).
    special_ok = (np.isnan(got) & np.isnan(want)) | (got == want)
    error = np.where(finite, error, np.where(special_ok, 0.0, np.inf))
    error = np.where(np.isnan(error), np.inf, error)   # a NaN output where ref is finite
    return _summarize(out, ref, error, what)


def _summarize(out: np.ndarray, ref: np.ndarray, error: np.ndarray, what: str,
               exact: bool = False) -> Comparison:
    """Turn per-element errors into a Comparison with the worst elements."""
    if error.size == 0:
        return Comparison(True, "")
    worst_flat = np.argsort(error, axis=None)[::-1][:WORST_SHOWN]
    worst = [(tuple(int(i) for i in np.unravel_index(k, error.shape)),
              out.flat[k].item(), ref.flat[k].item(), float(error.flat[k]))
             for k in worst_flat if error.flat[k] > 1.0]
    max_error = float(error.max())
    if max_error <= 1.0:
        return Comparison(True, "", max_error)
    wrong = int(np.count_nonzero(error > 1.0))
    index, got, want, _ = worst[0]
    kind = ("differ" if exact else "exceed the tolerance") if wrong > 1 else (
        "differs" if exact else "exceeds the tolerance")
    return Comparison(False, f"{what}: {wrong} of {error.size} elements {kind} (worst at "
                             f"{list(index)}: got {got!r}, expected {want!r}; max normalized "
                             f"error {max_error:.3g})", max_error, worst)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


def degenerate_reason(ref: np.ndarray) -> str | None:
    """Why a reference output cannot tell right from wrong, or None when it can."""
    if ref.size == 0:
        return "the reference output is empty"
    if ref.dtype.kind not in "fc":
        return "the reference output is constant" if ref.size > 1 and np.all(ref == ref.flat[0]) \
            else None
    values = ref.astype(np.float64)
    if not np.all(np.isfinite(values)):
        bad = int(np.count_nonzero(~np.isfinite(values)))
        return f"the reference output has {bad} NaN/inf elements of {values.size}"
    if not np.any(values):
        return "the reference output is all zero"
    if values.size > 1:
        spread = float(np.max(values) - np.min(values))
        if spread <= 1e-6 * float(np.max(np.abs(values))):
            return f"the reference output is constant ({values.flat[0]!r} everywhere)"
    return None


def worst_text(worst: list) -> str:
    """The worst elements as lines for a report or a prompt."""
    return "\n".join(f"  at {list(index)}: got {got!r}, expected {want!r} "
                     f"(normalized error {err:.3g})" for index, got, want, err in worst)


__all__ = ["Comparison", "compare", "degenerate_reason", "worst_text"]
