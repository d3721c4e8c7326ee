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
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np

from tegula.fuzz import numerics as nx
from tegula.fuzz.program import Cumsum, Loop, Program, Reduce, check
from tegula.fuzz.reference import Features, Value, reference
from tegula.fuzz.source import forget_kernel, kernel_source, make_kernel

_SPECIALS = (0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 1e-40, -3e38, 65504.0,
             448.0)
_POISON = {"f32": -1234.5, "f16": -1234.5, "bf16": -1232.0, "f8e4m3": -0.01171875,
           "f8e5m2": -0.01171875, "i32": -0x5A5A5A5A, "i8": -91, "u8": 165}


#: Every program runs for each of these: the Hopper path (wgmma, TMA, mbarriers where the
#: program allows) and the Ampere path (mma.sync, cp.async, ldmatrix).
TARGETS = ("sm_90a", "sm_80")

#: A target that refuses a program another target ran hands it to its fallback: sm_80 has no 8-bit float
#: mma.sync, sm_89 (the same Ampere path) has, so FP8 GEMMs still get a second target; sm_89
#: has no thread-block clusters (nor 227 KB of shared memory), sm_90 (the Ampere path built
#: for the H100) has, so clustered programs do too.
FALLBACK_TARGETS = {"sm_80": "sm_89", "sm_89": "sm_90"}

#: The order the warp roles of a warp-specialized build run in (`tg.emulate(role_order=)`):
#: "random" draws a different interleaving per program (`random:<data seed>`), so a run
#: explores many, each reproducible; "listed" and "reversed" are the two fixed ones;
#: "stall" / "stall-reversed" hold a role after each named-barrier arrive while the others
#: run ahead (`emulate.roles`: a role lapping another).
ROLE_ORDERS = ("random", "listed", "reversed", "stall", "stall-reversed")

#: What a target's build used, from the emulator's statement kinds.
PATH_KINDS = {"wgmma": ("Wgmma",), "TMA": ("TmaLoad", "TmaStore"),
              "TMA store": ("TmaStore",), "named barrier": ("NamedBarrier",),
              "mbarrier": ("MBarrierWait",), "warp roles": ("Roles",),
              "cp.async": ("CpAsync",), "mma.sync": ("Mma",), "ldmatrix": ("LdMatrix",)}


@dataclass
class Verdict:
    status: str  # pass, rejected, mismatch, internal
    reason: str = ""  # a short, stable description (tallied; the shrinker keeps it)
    detail: str = ""  # the full message / first wrong elements
    wild_fraction: float = 0.0  # share of output elements the reference could not decide
    target: str = ""  # the target that failed (or refused), when one did
    #: per target run: (status, reason, paths it took: a frozenset of PATH_KINDS keys)
    targets: dict = field(default_factory=dict)

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


def run_emulator(program: Program, inputs: dict, source: str | None = None,
                 target: str = TARGETS[0]):
    """(output arrays by name, None) from `tg.emulate` for `target`, or (None, Verdict) if
    it raised."""
    outputs, verdict, _ = emulate_for(program, inputs, target, source)
    return outputs, verdict


def role_order_for(role_order: str, data_seed: int) -> str:
    """`tg.emulate`'s role_order for a program run with `data_seed` (`ROLE_ORDERS`)."""
    if role_order not in ROLE_ORDERS:
        raise ValueError(f"role order must be one of {ROLE_ORDERS}, not {role_order!r}")
    return f"random:{data_seed}" if role_order == "random" else role_order


def build_options(program: Program, target: str) -> dict:
    """The build options the program asks of `target` (`Program.warp_specialize`,
    `Program.consumers`: sm_90a's warp roles; other targets have none and build without
    them). The emulator and a GPU launch pass the same ones."""
    if target != "sm_90a":
        return {}
    options = {"warp_specialize": program.warp_specialize, "consumers": program.consumers}
    return {k: v for k, v in options.items() if v is not None}


def emulate_for(program: Program, inputs: dict, target: str, source: str | None = None,
                role_order: str = "listed"):
    """(outputs, None, paths) from `tg.emulate(..., target=target, role_order=role_order)`,
    or (None, Verdict, frozenset()) if it raised; `paths` names what the run executed
    (`PATH_KINDS`)."""
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
            # inf and NaN are the point: no warnings; nor the ClusterWarning of a cluster
            # program whose near-miss tiles take no multicasting pipeline
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", tg.ClusterWarning)
                report = tg.emulate(kernel, program.launch_grid, *arrays, target=target,
                                    role_order=role_order, **build_options(program, target))
            # The CUDA the same build prints (no compiler needed): a program the emulator
            # runs but codegen refuses would fail only at a GPU launch.
            for built in list(getattr(kernel, "_builds", {}).values()):
                built.cuda_source()
        except Exception as e:  # noqa: BLE001 — every error is classified
            return None, classify_error(e), frozenset()
        paths = frozenset(path for path, kinds in PATH_KINDS.items()
                          if any(report.kind(k).count for k in kinds))
        return outputs, None, paths
    finally:
        forget_kernel(filename)


def check_template(describe: str, targets: tuple, run, judge) -> tuple:
    """(status, reason, detail) of a template generator's program (`split_merge`,
    `gemm_chains`): `run(target)` emulates it and returns its outputs (an AssertionError
    is the program's own check failing after the run: a mismatch), `judge(outputs)` names
    the first wrong element or returns "". "rejected" where every target refused it with a
    clean TegulaError; "internal" for an emulation error, an error saying internal or a
    crash. A pass's reason lists the targets that refused it."""
    from tegula.emulate.errors import EmulationError
    from tegula.errors import TegulaError
    refused = []
    for target in targets:
        try:
            got = run(target)
        except AssertionError as e:
            return "mismatch", f"check after the run on {target}", f"{describe}\n{e}"
        except EmulationError as e:
            return "internal", f"EmulationError on {target}", f"{describe}\n{e}"
        except TegulaError as e:
            if "internal" in str(e).lower():
                return "internal", f"{type(e).__name__} on {target}", f"{describe}\n{e}"
            refused.append(f"{target}: {type(e).__name__}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 — a crash inside the compiler
            return "internal", f"{type(e).__name__} on {target}", f"{describe}\n{e!r}"
        wrong = judge(got)
        if wrong:
            return "mismatch", f"wrong element on {target}", f"{describe}\n{wrong}"
    if len(refused) == len(targets):
        return "rejected", refused[0].split("\n")[0][:100], "\n".join(refused)
    return "pass", "; ".join(r.split("\n")[0][:120] for r in refused), describe


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


def run_program(program: Program, data_seed: int, features: Features | None = None,
                targets: tuple = TARGETS, role_order: str = "random") -> Verdict:
    """Emulate `program` on random inputs (seeded) for each target (and the fallback of
    one that refuses it), its warp roles in `role_order` (`ROLE_ORDERS`: by default an
    interleaving drawn from `data_seed`), judge each against the reference, and the
    targets' outputs against each other (`compare_targets`). The
    verdict is the first failure (naming its target), else a pass if any target ran it,
    else the first target's refusal; `Verdict.targets` holds every target's outcome."""
    inputs = program_inputs(program, data_seed)
    order = role_order_for(role_order, data_seed)
    expected, runs, verdicts, outcome = None, {}, {}, {}
    queue = list(targets)
    while queue:
        target = queue.pop(0)
        outputs, verdict, paths = emulate_for(program, inputs, target, role_order=order)
        ran_elsewhere = any(v.status == "pass" for v in verdicts.values())
        if verdict is not None and verdict.status == "rejected" and ran_elsewhere and \
                target in FALLBACK_TARGETS and FALLBACK_TARGETS[target] not in targets:
            queue.insert(0, FALLBACK_TARGETS[target])
        if verdict is None:
            if expected is None:
                expected = reference(program, inputs, False, features)
            verdict = check_outputs(program, inputs, outputs, features=features,
                                    reference_outputs=expected)
            runs[target] = outputs
        verdicts[target] = verdict
        outcome[target] = (verdict.status, verdict.reason, paths)
    failed = [(t, v) for t, v in verdicts.items() if v.failed]
    passing = [v for v in verdicts.values() if v.status == "pass"]
    if failed:
        target, v = failed[0]
        return Verdict(v.status, f"{target}: {v.reason}", f"target {target}:\n{v.detail}",
                       v.wild_fraction, target, outcome)
    disagreement = compare_targets(program, expected, runs) if len(runs) >= 2 else None
    if disagreement is not None:
        disagreement.targets = outcome
        return disagreement
    if passing:
        return Verdict("pass", wild_fraction=passing[0].wild_fraction, targets=outcome)
    v = verdicts[targets[0]]
    return Verdict(v.status, v.reason, v.detail, target=targets[0], targets=outcome)


def _order_fixed(program: Program) -> bool:
    """Does the program compute every float the same way whatever the layouts? Float
    sums reduced along a tile take their order from the layout synthesis chose for the
    target, so two targets may round them differently within the reference's bound. A
    gemm's accumulator is rounded after every instruction's K step (k16; k32 for 8-bit
    types) in K order on both paths (wgmma and mma.sync), so gemms count as fixed."""
    types = check(program)

    def fixed(body) -> bool:
        return all(fixed(s.body) if isinstance(s, Loop) else
                   not (isinstance(s, (Reduce, Cumsum)) and getattr(s, "kind", "sum") == "sum"
                        and nx.is_float(types[s.x].dtype)) for s in body)
    return fixed(program.body)


def compare_targets(program: Program, expected: dict, runs: dict) -> Verdict | None:
    """A mismatch if another target's outputs differ from the first's where they must
    agree: every element (NaN matches NaN, +0 matches -0) when the program fixes the order
    of its float arithmetic (`_order_fixed`); otherwise each target is already within the
    reference's bound and nothing more is asked."""
    if not _order_fixed(program):
        return None
    (first, a), *others = list(runs.items())
    for second, b in others:
        problems = [_differences(name, a[name], b[name], expected[name], first, second)
                    for name in a]
        problems = [p for p in problems if p]
        if problems:
            return Verdict("mismatch", f"{first} and {second} disagree", "\n".join(problems),
                           target=f"{first}/{second}")
    return None


def _differences(name: str, x: np.ndarray, y: np.ndarray, want: Value, first: str,
                 second: str) -> str:
    if nx.is_float(want.dtype):
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
    else:
        # Where the reference leaves an integer undecided (a bitcast of a NaN: its sign
        # and payload are the arithmetic's, which two targets' orders may pick apart).
        same = (x.astype(np.int64) == y.astype(np.int64)) | want.wild
    if same.all():
        return ""
    where = np.argwhere(~same)
    lines = [f"output {name}: {len(where)} of {same.size} elements differ between {first} "
             f"and {second}"]
    for idx in where[:6]:
        i = tuple(int(k) for k in idx)
        lines.append(f"  [{i[0]}, {i[1]}]: {first} {x[i]!r}, {second} {y[i]!r}, "
                     f"reference {want.val[i]!r}")
    return "\n".join(lines)


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
    #: target -> {"passed": n, "rejected": n, and per path (PATH_KINDS): programs that
    #: passed on that target having executed it}
    by_target: dict = field(default_factory=dict)
    #: (target that refused, reason) -> programs another target ran and passed
    refused_by_one: dict = field(default_factory=dict)

    def add(self, v: Verdict) -> None:
        self.programs += 1
        self._add_targets(v.targets)
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

    def _add_targets(self, outcome: dict) -> None:
        for target, (status, reason, paths) in outcome.items():
            counts = self.by_target.setdefault(target, {})
            counts[status] = counts.get(status, 0) + 1
            if status == "pass":
                for path in paths:
                    counts[path] = counts.get(path, 0) + 1
        if any(status == "pass" for status, _, _ in outcome.values()):
            for target, (status, reason, _) in outcome.items():
                if status == "rejected":
                    key = (target, reason)
                    self.refused_by_one[key] = self.refused_by_one.get(key, 0) + 1

    @property
    def failures(self) -> int:
        return self.mismatches + self.internal

    def path_report(self) -> list[str]:
        """Per target: programs passed and refused, and how many passed through each path."""
        lines = []
        for target, counts in self.by_target.items():
            paths = ", ".join(f"{path} {counts.get(path, 0)}" for path in PATH_KINDS)
            lines.append(f"  {target}: passed {counts.get('pass', 0)}, rejected "
                         f"{counts.get('rejected', 0)}; passed through {paths}")
        for (target, reason), count in sorted(self.refused_by_one.items(),
                                              key=lambda kv: -kv[1]):
            lines.append(f"  refused only by {target} x{count}: {reason}")
        return lines

    def report(self) -> str:
        lines = [f"programs {self.programs}: passed {self.passed}, rejected {self.rejected}, "
                 f"mismatches {self.mismatches}, internal errors {self.internal}"]
        lines += self.path_report()
        if self.passed:
            lines.append(f"  undecidable output elements (not compared): "
                         f"{100 * self.wild / self.passed:.1f}% on average")
        for reason, count in sorted(self.reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"  rejected x{count}: {reason}")
        return "\n".join(lines)


__all__ = ["Verdict", "Tally", "run_program", "run_emulator", "emulate_for", "check_outputs",
           "build_options",
           "compare_targets", "TARGETS", "FALLBACK_TARGETS", "PATH_KINDS", "ROLE_ORDERS",
           "role_order_for",
           "program_inputs", "random_values", "classify_error", "compare", "data_seed",
           "tensor_order"]
