"""Running fuzz programs: random inputs, the kernel in the emulator, the reference, and a
verdict.

Verdicts: "pass"; "rejected" — a clean `TegulaError` for a program tegula does not
support (counted, with its reason); "mismatch" — an output element outside the
reference's error bound (a wrong answer); "internal" — an error whose message says
"internal", an `EmulationError` (the emulator caught the compiled program reading out of
bounds, racing, ...), a code generation error, or any exception that is not a
`TegulaError` (a crash inside the compiler).
"""
from __future__ import annotations

import re
import traceback
import zlib
from dataclasses import dataclass, field

import numpy as np

from tegula.fuzz import numerics as nx
from tegula.fuzz.program import Program
from tegula.fuzz.reference import Features, Value, reference
from tegula.fuzz.source import forget_kernel, kernel_source, make_kernel

_SPECIALS = (0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 1e-40, -3e38, 65504.0,
             448.0)
_POISON = {"f32": -1234.5, "f16": -1234.5, "bf16": -1232.0, "f8e4m3": -0.01171875,
           "f8e5m2": -0.01171875, "i32": -0x5A5A5A5A, "i8": -91, "u8": 165}


@dataclass
class Verdict:
    status: str  # pass, rejected, mismatch, internal
    reason: str = ""  # a short, stable description (tallied; the shrinker keeps it)
    detail: str = ""  # the full message / first wrong elements
    wild_fraction: float = 0.0  # share of output elements the reference could not decide

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "internal")


def random_values(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    """Exact values of `dtype` (float64 / int64): mostly ordinary numbers at a random
    scale, with NaN, infinities, zeros of both signs and extremes mixed in."""
    size = int(np.prod(shape))
    if nx.is_float(dtype):
        scale = rng.choice((1.0, 4.0, 100.0))
        values = rng.standard_normal(size) * scale
        integral = rng.random(size) < 0.2
        values = np.where(integral, np.round(values), values)
        special_rate = rng.choice((0.0, 0.02, 0.1))
        special = rng.random(size) < special_rate
        values = np.where(special, rng.choice(_SPECIALS, size), values)
        return nx.round_float(values, dtype).reshape(shape)
    low, high = nx.INTS[dtype]
    if dtype == "i32":
        small = rng.integers(-200, 200, size)
        wide = rng.integers(low, high, size, endpoint=True)
        values = np.where(rng.random(size) < 0.15, wide, small)
        values = np.where(rng.random(size) < 0.02, rng.choice((low, high), size), values)
    else:
        values = rng.integers(low, high, size, endpoint=True)
    return values.astype(np.int64).reshape(shape)


def program_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    """Random exact values for every input tensor the program reads."""
    rng = np.random.default_rng(seed)
    return {t.name: random_values(rng, program.extents(t), t.dtype)
            for t in program.tensors if t.kind != "out"}


def _reason(e: BaseException) -> str:
    """A stable key for an error: its class and first line, numbers and names blurred."""
    first = str(e).splitlines()[0] if str(e) else ""
    first = re.sub(r"%?\b[a-z]*\d+[\w.]*", "#", first)
    return f"{type(e).__name__}: {first[:100]}"


def classify_error(e: BaseException) -> Verdict:
    from tegula.emulate.errors import EmulationError
    from tegula.errors import CompileError, TegulaError
    text = str(e)
    detail = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
    if not isinstance(e, TegulaError) or isinstance(e, (EmulationError, CompileError)) or \
            "internal" in text.lower() or type(e).__name__ == "CodegenError":
        return Verdict("internal", _reason(e), detail)
    return Verdict("rejected", _reason(e), text)


def tensor_order(program: Program) -> list:
    """The kernel's tensor parameters, in signature order (what `kernel_source` emits)."""
    from tegula.fuzz.source import used_tensors
    used = used_tensors(program.body)
    return [t for t in program.tensors if t.name in used]


def compare(expected: Value, actual: np.ndarray) -> np.ndarray:
    """Elements of `actual` (the implementation's storage values) that the reference
    rules out (wild elements are never ruled out)."""
    if nx.is_float(expected.dtype):
        got = actual.astype(np.float64)
        want, err = expected.val, expected.err
        with np.errstate(invalid="ignore"):
            ok = (np.isnan(got) & np.isnan(want)) | (got == want) | (np.abs(got - want) <= err)
    else:
        ok = actual.astype(np.int64) == expected.val
    return ~ok & ~expected.wild


def describe_mismatch(name: str, expected: Value, actual: np.ndarray, bad: np.ndarray) -> str:
    where = np.argwhere(bad)
    lines = [f"output {name} ({expected.dtype}): {len(where)} of {bad.size} elements wrong"]
    for idx in where[:6]:
        i = tuple(int(k) for k in idx)
        want = expected.val[i]
        bound = f" ± {expected.err[i]:.3g}" if expected.err[i] else ""
        lines.append(f"  [{i[0]}, {i[1]}]: expected {want!r}{bound}, got {actual[i]!r}")
    return "\n".join(lines)


def run_emulator(program: Program, inputs: dict, source: str | None = None):
    """(output arrays by name, None) from `tg.emulate`, or (None, Verdict) if it raised."""
    import tegula as tg
    source = source or kernel_source(program)
    kernel, filename = make_kernel(source)
    try:
        arrays = []
        outputs = {}
        for t in tensor_order(program):
            if t.kind == "out":
                a = nx.storage(np.full(program.extents(t), _POISON[t.dtype]), t.dtype)
                outputs[t.name] = a
            else:
                a = nx.storage(inputs[t.name], t.dtype)
            arrays.append(a)
        try:
            with np.errstate(all="ignore"):  # inf and NaN are the point: no warnings
                tg.emulate(kernel, program.grid, *arrays)
        except Exception as e:  # noqa: BLE001 — every error is classified
            return None, classify_error(e)
        return outputs, None
    finally:
        forget_kernel(filename)


def check_outputs(program: Program, inputs: dict, outputs: dict, loose: bool = False,
                  features: Features | None = None, reference_outputs=None) -> Verdict:
    expected = reference_outputs or reference(program, inputs, loose, features)
    problems, wild, total = [], 0, 0
    for name, want in expected.items():
        got = outputs[name]
        bad = compare(want, got)
        wild += int(want.wild.sum())
        total += want.wild.size
        if bad.any():
            problems.append(describe_mismatch(name, want, got, bad))
    fraction = wild / total if total else 0.0
    if problems:
        return Verdict("mismatch", "mismatch", "\n".join(problems), fraction)
    return Verdict("pass", wild_fraction=fraction)


def run_program(program: Program, data_seed: int, features: Features | None = None) -> Verdict:
    """Emulate `program` on random inputs (seeded) and judge it against the reference."""
    inputs = program_inputs(program, data_seed)
    outputs, verdict = run_emulator(program, inputs)
    if verdict is not None:
        return verdict
    return check_outputs(program, inputs, outputs, features=features)


def data_seed(seed: int, index: int) -> int:
    return zlib.crc32(f"data {seed} {index}".encode())


@dataclass
class Tally:
    """Counts of a fuzz run."""

    programs: int = 0
    passed: int = 0
    rejected: int = 0
    mismatches: int = 0
    internal: int = 0
    reasons: dict = field(default_factory=dict)  # rejection reason -> count
    wild: float = 0.0  # summed wild fractions of passing programs

    def add(self, v: Verdict) -> None:
        self.programs += 1
        if v.status == "pass":
            self.passed += 1
            self.wild += v.wild_fraction
        elif v.status == "rejected":
            self.rejected += 1
            self.reasons[v.reason] = self.reasons.get(v.reason, 0) + 1
        elif v.status == "mismatch":
            self.mismatches += 1
        else:
            self.internal += 1

    @property
    def failures(self) -> int:
        return self.mismatches + self.internal

    def report(self) -> str:
        lines = [f"programs {self.programs}: passed {self.passed}, rejected {self.rejected}, "
                 f"mismatches {self.mismatches}, internal errors {self.internal}"]
        if self.passed:
            lines.append(f"  undecidable output elements (not compared): "
                         f"{100 * self.wild / self.passed:.1f}% on average")
        for reason, count in sorted(self.reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"  rejected x{count}: {reason}")
        return "\n".join(lines)


__all__ = ["Verdict", "Tally", "run_program", "run_emulator", "check_outputs",
           "program_inputs", "random_values", "classify_error", "compare", "data_seed",
           "tensor_order"]
