"""Tensor arguments that overlap in memory at launch.

A kernel that writes a tensor which shares memory with another of its tensor arguments
(`x` and `x[1:]`, or one tensor passed twice) reads values that depend on which block or
thread ran first: the GPU has no order between blocks. So every launch checks, for each
tensor the kernel writes (`TensorParam.writes`) against every other tensor argument, that
their byte ranges are disjoint, and raises `LaunchError` naming the kernel, both arguments
and the user's call line otherwise. Only tensors the kernel writes are checked: two
read-only arguments may share memory freely.

Identical in place. The same tensor (same pointer, extents, strides and element size)
passed as an output and as an input is allowed where the kernel is provably element-wise
in place (`in_place_reason` returns None): every load of the input is followed, in the
same statement list, by a store to the output at the same element offset (renaming the
input's extents and strides to the output's: they are equal), with the same vector width
and predicate, so each element is read and then written by the one thread that owns it.
Loads inside a loop must also name the loop's variable (a load of the same element in
every iteration would read the thread's own earlier store). Anything else is refused:
TMA or cp.async copies (the data crosses threads through shared memory), atomic adds,
scalar loads (`offsets[e]`), warp roles, or two written tensors.

Kept cheap for replays (`PreparedLaunch`): the rules depend on the kernel only, and a
prepared launch's extents and strides are fixed, so each checked pair is a few integers
(`AliasCheck.c_pairs`: the byte ranges relative to each pointer) compared per launch in
C (`fastcall.launch_direct`); where ranges overlap the launch falls to Python
(`AliasCheck.check`), which allows identical in-place use and strided views whose
elements interleave without sharing a byte, and raises otherwise.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from tegula.errors import LaunchError, call_site
from tegula.lower.async_ir import TensorMapParam
from tegula.lower.thread_ir import (Assign, BinOp, Comment, CpAsync, For, GlobalAtomicAdd,
                                    GlobalLoad, GlobalStore, If, Let, Select, TensorParam,
                                    ThreadKernel, Var, scalar_loaded_tensors, walk)

#: Above this many elements in each tensor, partly overlapping strided views are not
#: compared element by element (memory, time): they are refused as overlapping.
EXACT_LIMIT = 1 << 22


class AliasRule:
    """One checked pair: `written` (a tensor the kernel writes) against `other` (any other
    tensor argument); `reason` is None where the identical tensor may be passed as both
    (element-wise in place), else why not — worked out from the thread IR on first use
    only (most launches never share memory, and the walk costs a few ms)."""

    __slots__ = ("kernel", "written", "other", "_reason")

    def __init__(self, kernel: ThreadKernel, written: str, other: str):
        self.kernel, self.written, self.other = kernel, written, other
        self._reason: list = []

    @property
    def reason(self) -> str | None:
        if not self._reason:
            self._reason.append(in_place_reason(self.kernel, self.written, self.other))
        return self._reason[0]

    def __repr__(self) -> str:
        return f"AliasRule({self.written!r} written, {self.other!r})"


def alias_rules(kernel: ThreadKernel) -> tuple[AliasRule, ...]:
    """The pairs a launch of `kernel` checks (each unordered pair once)."""
    tensors = [p for p in kernel.params if isinstance(p, TensorParam)]
    rules, seen = [], set()
    for w in tensors:
        if not w.writes:
            continue
        for o in tensors:
            if o.name == w.name or frozenset((w.name, o.name)) in seen:
                continue
            seen.add(frozenset((w.name, o.name)))
            rules.append(AliasRule(kernel, w.name, o.name))
    return tuple(rules)


def in_place_reason(kernel: ThreadKernel, written: str, other: str) -> str | None:
    """None where passing one tensor as both `written` and `other` is element-wise in
    place (module docstring), else the reason it is not."""
    params = {p.name: p for p in kernel.params if isinstance(p, TensorParam)}
    if params[other].writes:
        return f"the kernel writes both {written!r} and {other!r}"
    mapped = {p.tensor for p in kernel.params if isinstance(p, TensorMapParam)}
    if mapped & {written, other}:
        return "the kernel moves it with TMA copies, whose boxes cross threads"
    if scalar_loaded_tensors(kernel.body) & {written, other}:
        return "the kernel reads it as a scalar (an index table)"
    for s in walk(kernel.body):
        touches = getattr(s, "tensor", None) in (written, other)
        if touches and isinstance(s, GlobalAtomicAdd):
            return "the kernel adds to it atomically"
        if touches and isinstance(s, CpAsync):
            return "the kernel copies it with cp.async through shared memory"
        if hasattr(s, "roles") and any(isinstance(t, (GlobalLoad, GlobalStore)) and
                                       t.tensor in (written, other) for t in walk([s])):
            return "the kernel accesses it inside warp roles"
    rename = {f"{other}_{kind}{d}": f"{written}_{kind}{d}" for kind in ("shape", "stride")
              for d in range(params[other].rank)}
    lets = {s.var.name: s.value for s in walk(kernel.body) if isinstance(s, Let)}
    # Replicas: where no value crosses threads and `written` is the only output, threads
    # that load a replicated element but are predicated off its store (`tid`-only
    # conjuncts) cannot carry what they read anywhere.
    private = all(isinstance(s, _PRIVATE) for s in walk(kernel.body)) and \
        [p.name for p in params.values() if p.writes] == [written]
    return _unmatched_load(kernel.body, written, other, (rename, lets, private), ())


#: Statements that move no value between threads (no shared memory, shuffles, tensor
#: cores or asynchronous copies).
_PRIVATE = (Comment, Let, Assign, GlobalLoad, GlobalStore, For, If)


def _unmatched_load(stmts: list, written: str, other: str, how: tuple,
                    loops: tuple) -> str | None:
    """The reason the first load of `other` in `stmts` (recursively) has no matching later
    store to `written` in its own list, or None where every one has; `how`: (the renaming
    of `other`'s extents and strides, the kernel's `Let`s, whether replicas may skip)."""
    for i, s in enumerate(stmts):
        if isinstance(s, For):
            found = _unmatched_load(s.body, written, other, how, loops + (s.var.name,))
        elif isinstance(s, If):
            found = (_unmatched_load(s.then, written, other, how, loops) or
                     _unmatched_load(s.otherwise, written, other, how, loops))
        elif isinstance(s, GlobalLoad) and s.tensor == other:
            found = _match(s, stmts[i + 1:], written, how, loops)
        else:
            found = None
        if found:
            return found
    return None


def _match(load: GlobalLoad, later: list, written: str, how: tuple, loops: tuple) -> str | None:
    rename, lets, private = how
    index, pred = _renamed(load.index, rename), _renamed(load.pred, rename)
    if loops and loops[-1] not in _names(index, lets):
        return (f"a load of {load.tensor!r} inside a loop does not depend on the loop's "
                f"variable (later iterations would read the thread's own stores)")
    for s in later:
        if not (isinstance(s, GlobalStore) and s.tensor == written and s.count == load.count
                and _renamed(s.index, rename) == index):
            continue
        stored = _renamed(s.pred, rename)
        if stored == pred or (private and isinstance(stored, BinOp) and stored.op == "and"
                              and stored.lhs == pred and _names(stored.rhs, lets) <= {"tid"}):
            return None
    return (f"a load of {load.tensor!r} is not followed by a store to {written!r} of the "
            f"same elements by the same thread (the elements a thread reads may be written "
            f"by another thread or block first)")


def _renamed(e, rename: dict):
    if isinstance(e, Var):
        return Var(rename.get(e.name, e.name))
    if isinstance(e, BinOp):
        return replace(e, lhs=_renamed(e.lhs, rename), rhs=_renamed(e.rhs, rename))
    if isinstance(e, Select):
        return Select(_renamed(e.cond, rename), _renamed(e.if_true, rename),
                      _renamed(e.if_false, rename))
    return e


def _names(e, lets: dict, seen: set | None = None) -> set[str]:
    """Variable names `e` reads, through the `Let`s it names."""
    seen = set() if seen is None else seen
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Var) and x.name not in seen:
            seen.add(x.name)
            if x.name in lets:
                stack.append(lets[x.name])
        elif isinstance(x, BinOp):
            stack += [x.lhs, x.rhs]
        elif isinstance(x, Select):
            stack += [x.cond, x.if_true, x.if_false]
    return seen


# --------------------------------------------------------------------------------------
# Byte ranges
# --------------------------------------------------------------------------------------

def byte_range(shape: Sequence[int], strides: Sequence[int], bits: int) -> tuple[int, int] | None:
    """[lo, hi) bytes relative to the data pointer that a tensor of these extents and
    element strides (in elements; 4-bit tensors count nibbles) covers, or None if empty."""
    if 0 in shape:
        return None
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides))
    return (lo * bits) // 8, ((hi + 1) * bits + 7) // 8


def elements_share_bytes(a: tuple, b: tuple) -> bool:
    """Whether two tensors (each (ptr, shape, strides, bits)) whose byte ranges overlap
    have a byte in common: exactly up to `EXACT_LIMIT` elements each, else True."""
    sizes = [int(np.prod(t[1], dtype=np.int64)) for t in (a, b)]
    if max(sizes) > EXACT_LIMIT:
        return True
    starts = [_byte_starts(*t) for t in (a, b)]
    widths = [max(1, t[3] // 8) for t in (a, b)]
    first, second = np.sort(starts[0]), starts[1]
    if np.any(first[1:] < first[:-1] + widths[0]):
        return True  # the first overlaps itself (a zero stride): treat as shared
    at = np.searchsorted(first, second + widths[1]) - 1  # the last start below each end
    hit = at >= 0
    return bool(np.any(first[at[hit]] + widths[0] > second[hit]))


def _byte_starts(ptr: int, shape, strides, bits: int) -> np.ndarray:
    offs = np.zeros(1, dtype=np.int64)
    for n, s in zip(shape, strides):
        offs = (offs[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    return ptr + (offs * bits) // 8


def writes_itself(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a tensor's elements may share memory with each other (a broadcast view):
    sorted by stride, each stride must pass the span of the dims below it."""
    if 0 in shape:
        return False  # no elements
    dims = sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1)
    reach = 0
    for stride, n in dims:
        if stride <= reach:
            return True
        reach += (n - 1) * stride
    return False


# --------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------

def check_views(kernel_name: str, rules: Sequence[AliasRule], views: dict,
                bits: dict, where: str = "launch") -> None:
    """Raise `LaunchError` where a rule's two tensors share memory other than as the
    identical tensor of an element-wise in-place kernel; `views[name]` is (ptr, shape,
    strides), `bits[name]` its element size. Written tensors that overlap themselves
    (a broadcast output) are refused too."""
    for name, (ptr, shape, strides) in views.items():
        if any(r.written == name for r in rules) and writes_itself(shape, strides):
            raise LaunchError(f"{where} of kernel {kernel_name}: output {name!r} has elements "
                              f"that share memory (extents {tuple(shape)}, strides "
                              f"{tuple(strides)}: a broadcast view); several threads would "
                              f"store to one element. Pass a tensor of its own "
                              f"(.contiguous())", call_site())
    for rule in rules:
        a, b = views[rule.written], views[rule.other]
        ra, rb = (byte_range(v[1], v[2], bits[n]) for v, n in ((a, rule.written),
                                                               (b, rule.other)))
        if ra is None or rb is None or not (a[0] + ra[0] < b[0] + rb[1] and
                                            b[0] + rb[0] < a[0] + ra[1]):
            continue
        raise_if_shared(kernel_name, rule, a, b, bits, where)


def raise_if_shared(kernel_name: str, rule: AliasRule, a: tuple, b: tuple, bits: dict,
                    where: str) -> None:
    """`rule`'s tensors `a` and `b` ((ptr, shape, strides)) have overlapping byte
    ranges: raise unless they are identical and the kernel is in place, or their elements
    interleave without sharing a byte."""
    identical = (a[0] == b[0] and tuple(a[1]) == tuple(b[1]) and tuple(a[2]) == tuple(b[2])
                 and bits[rule.written] == bits[rule.other])
    if identical and rule.reason is None:
        return
    if not identical and not elements_share_bytes(a + (bits[rule.written],),
                                                  b + (bits[rule.other],)):
        return
    how = "the same tensor is passed as both" if identical else "their memory overlaps"
    why = (f"; it cannot run in place: {rule.reason}" if identical else
           "; only the identical tensor may be both, and only for a kernel that reads and "
           "writes each element in one thread")
    raise LaunchError(
        f"{where} of kernel {kernel_name}: arguments {rule.written!r} (written) and "
        f"{rule.other!r} share memory ({how}{why}). The result would depend on the order "
        f"in which blocks run; pass a separate output (or a copy of the input)", call_site())


class AliasCheck:
    """A prepared launch's alias checks: its extents and strides are fixed, so each pair is
    its byte ranges relative to the two pointers (`c_pairs`, compared in C per launch:
    (i, lo_i, hi_i, j, lo_j, hi_j, same_ok), i and j argument positions, same_ok 1 where
    equal pointers mean the identical tensor of an in-place kernel), and `check` does the
    rest in Python where the ranges overlap."""

    __slots__ = ("kernel_name", "rules", "positions", "views", "bits", "c_pairs")

    def __init__(self, kernel_name: str, rules, positions: dict, views: dict, bits: dict):
        self.kernel_name, self.rules, self.positions = kernel_name, rules, positions
        self.views, self.bits = views, bits   # name -> (shape, strides); name -> bits
        pairs = []
        for r in rules:
            ra = byte_range(*views[r.written], bits[r.written])
            rb = byte_range(*views[r.other], bits[r.other])
            if ra is None or rb is None:
                continue
            same = (views[r.written] == views[r.other] and bits[r.written] == bits[r.other]
                    and r.reason is None)   # (the reason is worked out only where equal)
            pairs.append((positions[r.written], ra[0], ra[1], positions[r.other], rb[0],
                          rb[1], int(same)))
        self.c_pairs = tuple(pairs)

    def check(self, pointers: Sequence[int]) -> None:
        """Raise `LaunchError` where this launch's pointers make a pair share memory."""
        for i, lo_i, hi_i, j, lo_j, hi_j, same in self.c_pairs:
            pi, pj = pointers[i], pointers[j]
            if pi + lo_i < pj + hi_j and pj + lo_j < pi + hi_i and not (same and pi == pj):
                self._slow(i, j, pi, pj)

    def _slow(self, i: int, j: int, pi: int, pj: int) -> None:
        names = {v: k for k, v in self.positions.items()}
        rule = next(r for r in self.rules
                    if self.positions[r.written] == i and self.positions[r.other] == j)
        raise_if_shared(self.kernel_name, rule, (pi,) + self.views[names[i]],
                        (pj,) + self.views[names[j]], self.bits, "launch")


__all__ = ["AliasRule", "AliasCheck", "alias_rules", "in_place_reason", "byte_range",
           "elements_share_bytes", "writes_itself", "check_views", "raise_if_shared",
           "EXACT_LIMIT"]
