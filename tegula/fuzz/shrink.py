"""Shrinking a failing fuzz program to a minimal one that fails the same way.

Greedy: try each simplification — drop a statement (with everything that depends on it),
replace a tile operand by a number, take the plain route for a load or store, drop a fill,
run a loop once, fewer gemm stages and a shorter K, a transposed gemm operand stored
K-major, shrink the tensors and the tile, lower the thread count, turn a type into
f32 — keep it if the program is still valid and still fails with the same verdict
(status and reason), and repeat until nothing helps or the budget runs out.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterator

from tegula.fuzz.program import (Assign, Binary, Gemm, InPlace, Invalid, Load, Loop, Num,
                                 Program, Store, Where, check, used_names)
from tegula.fuzz.runner import Verdict
from tegula.fuzz.source import used_tensors


def _paths(body, prefix=()) -> Iterator[tuple]:
    """Index paths of every statement, innermost and last first."""
    for i in reversed(range(len(body))):
        s = body[i]
        if isinstance(s, Loop):
            yield from _paths(s.body, prefix + (i,))
        yield prefix + (i,)


def _remove(body: tuple, path: tuple) -> tuple:
    if len(path) == 1:
        return body[:path[0]] + body[path[0] + 1:]
    loop = body[path[0]]
    return body[:path[0]] + (replace(loop, body=_remove(loop.body, path[1:])),) + \
        body[path[0] + 1:]


def _replace_at(body: tuple, path: tuple, new) -> tuple:
    if len(path) == 1:
        return body[:path[0]] + (new,) + body[path[0] + 1:]
    loop = body[path[0]]
    return body[:path[0]] + (replace(loop, body=_replace_at(loop.body, path[1:], new)),) + \
        body[path[0] + 1:]


def _at(body: tuple, path: tuple):
    s = body[path[0]]
    return s if len(path) == 1 else _at(s.body, path[1:])


def _without_dependents(body: tuple, name: str) -> tuple:
    """`body` minus every statement reading `name` (transitively)."""
    dead = {name}
    out = []
    for s in body:
        if isinstance(s, Loop):
            inner = _without_dependents_list(s.body, dead)
            out.append(replace(s, body=tuple(inner)))
            continue
        if used_names(s) & dead:
            if hasattr(s, "out"):
                dead.add(s.out)
            continue
        out.append(s)
    return tuple(out)


def _without_dependents_list(body, dead: set) -> list:
    out = []
    for s in body:
        if used_names(s) & dead:
            if hasattr(s, "out"):
                dead.add(s.out)
            continue
        out.append(s)
    return out


def candidates(p: Program) -> Iterator[Program]:
    """Simpler variants of `p`, roughly most helpful first (many are invalid)."""
    # Fewer statements.
    for path in _paths(p.body):
        s = _at(p.body, path)
        body = _remove(p.body, path)
        yield p.with_body(body)
        out = getattr(s, "out", None)
        if out is not None:
            yield p.with_body(_without_dependents(body, out))
    # Outputs of something earlier (so what fed the old one can go).
    yield from _earlier_outputs(p)
    # Simpler statements.
    for path in _paths(p.body):
        s = _at(p.body, path)
        for simpler in _simpler(s):
            yield p.with_body(_replace_at(p.body, path, simpler))
    # Smaller problems.
    yield from _smaller(p)
    # Fewer tensors (those no statement names any more).
    used = used_tensors(p.body)
    if len(used) < len(p.tensors):
        yield replace(p, tensors=tuple(t for t in p.tensors if t.name in used))


def _earlier_outputs(p: Program) -> Iterator[Program]:
    try:
        types = check(p)
    except Invalid:
        return
    for i, s in enumerate(p.body):
        if not isinstance(s, Store):
            continue
        for earlier in p.body[:i]:
            name = getattr(earlier, "out", None)
            if name is None or name == s.x or types[name].dtype == "bool":
                continue
            decl = p.tensor(s.tensor)
            new_decl = replace(decl, dtype=types[name].dtype, shape=types[name].shape)
            body = p.body[:i] + (replace(s, x=name),) + p.body[i + 1:]
            yield _retensor(p, decl, new_decl).with_body(body)


def _simpler(s) -> Iterator:
    if isinstance(s, Load):
        if s.route not in ("load", "transposed"):
            yield replace(s, route="load")
        if s.fill is not None:
            yield replace(s, fill=None)
    if isinstance(s, Store) and s.route != "copy":
        yield replace(s, route="copy")
    if isinstance(s, Loop) and s.stages > 1:
        yield replace(s, stages=1)
    if isinstance(s, Gemm):
        if s.roles:
            yield replace(s, roles=())
        if s.repeat > 1:
            yield replace(s, repeat=1)
        if s.scratch:
            yield replace(s, scratch=False)
        if s.stages > 1:
            yield replace(s, stages=s.stages - 1, roles=s.roles if s.stages > 2 else ())
        if s.stages <= 1 and s.route != "register":
            yield replace(s, route="register")
    if isinstance(s, Binary):
        for field in ("a", "b"):
            if isinstance(getattr(s, field), str):
                yield replace(s, **{field: Num(1.0)})
                yield replace(s, **{field: Num(1)})
    if isinstance(s, Where):
        for field in ("a", "b"):
            if isinstance(getattr(s, field), str):
                yield replace(s, **{field: Num(0.0)})
                yield replace(s, **{field: Num(0)})
    if isinstance(s, (InPlace, Assign)) and isinstance(s.x, str):
        yield replace(s, x=Num(1.0))
        yield replace(s, x=Num(1))


def _smaller(p: Program) -> Iterator[Program]:
    for m, n in ((p.BM, p.N), (p.M, p.BN), (1, p.N), (p.M, 1), (p.BM - 1, p.N),
                 (p.M, p.BN - 1)):
        if 1 <= m and 1 <= n and (m, n) != (p.M, p.N) and m <= p.M and n <= p.N:
            yield replace(p, M=m, N=n)
    for t in p.tensors:
        if t.kind.startswith("loop") and t.extent > 1:
            tile = p.BN if t.kind == "loop1" else p.BM
            for extent in (1, min(tile, t.extent - 1)):
                yield _retensor(p, t, replace(t, extent=extent))
    yield from _untransposed(p)
    gemm_a = [t for t in p.tensors if t.kind.startswith("gemm_a")]
    for a in gemm_a:  # a shorter K: both operands' extents, which must agree
        gemm = next((g for g in _statements(p.body) if isinstance(g, Gemm) and g.a == a.name),
                    None)
        if gemm is None or a.extent <= 1:
            continue
        b = p.tensor(gemm.b)
        for extent in (gemm.bk, a.extent - gemm.bk, 1):
            if 1 <= extent < a.extent:
                yield _retensor(_retensor(p, a, replace(a, extent=extent)), b,
                                replace(b, extent=extent))
        if gemm.stages > 0 and a.extent <= gemm.bk:
            yield p.with_body(_replace_at(p.body, _path_of(p.body, gemm),
                                          replace(gemm, stages=0)))
    if p.cluster > 1:
        yield replace(p, cluster=1)
    if p.persistent:
        yield replace(p, persistent=0)
        if p.persistent > 1:
            yield replace(p, persistent=1)
    if p.consumers is not None:
        yield replace(p, consumers=None)
    if p.warp_specialize is not None and p.consumers is None:
        yield replace(p, warp_specialize=None)
    for threads in (32, 64, 128):
        if threads < p.threads:
            yield replace(p, threads=threads)
    for bm, bn in ((p.BM // 2, p.BN), (p.BM, p.BN // 2)):
        if bm >= 1 and bn >= 1:
            yield replace(p, BM=bm, BN=bn, M=min(p.M, bm * 3), N=min(p.N, bn * 3))
    for t in p.tensors:
        if t.dtype != "f32":
            yield _retensor(p, t, replace(t, dtype="f32"))


def _untransposed(p: Program) -> Iterator[Program]:
    """Each transposed gemm operand stored K-major instead (or, read from shared memory,
    through the global `.T` view instead)."""
    for gemm in (g for g in _statements(p.body) if isinstance(g, Gemm)):
        for field, name in (("ta", gemm.a), ("tb", gemm.b)):
            trans = getattr(gemm, field)
            if not trans:
                continue
            t = p.tensor(name)
            path = _path_of(p.body, gemm)
            yield _retensor(p, t, replace(t, kind=t.kind[:-2])).with_body(
                _replace_at(p.body, path, replace(gemm, **{field: ""})))
            if trans == "smem":
                yield p.with_body(_replace_at(p.body, path, replace(gemm, **{field: "gmem"})))


def _path_of(body: tuple, stmt) -> tuple:
    return next(path for path in _paths(body) if _at(body, path) is stmt)


def _retensor(p: Program, old, new) -> Program:
    return replace(p, tensors=tuple(new if t is old else t for t in p.tensors))


def _statements(body) -> list:
    out = []
    for s in body:
        out.append(s)
        if isinstance(s, Loop):
            out += _statements(s.body)
    return out


def cost(p: Program) -> tuple:
    """What the shrinker minimizes, most important first; every accepted step lowers it,
    so shrinking ends."""
    stmts = _statements(p.body)
    position = {getattr(s, "out", None): i for i, s in enumerate(stmts)}
    stored = sum(position.get(s.x, 0) for s in stmts if isinstance(s, Store))
    tile_operands = sum(len(used_names(s)) for s in stmts if not isinstance(s, Loop))
    fancy = sum((getattr(s, "route", "load") not in ("load", "copy", "transposed"))
                + (getattr(s, "fill", None) is not None) + max(getattr(s, "stages", 1) - 1, 0)
                + sum({"": 0, "gmem": 1, "smem": 2}[getattr(s, f, "")] for f in ("ta", "tb"))
                for s in stmts)
    elements = p.M * p.N + sum(t.extent for t in p.tensors)
    non_f32 = sum(t.dtype != "f32" for t in p.tensors)
    fancy += (p.cluster > 1) + bool(p.persistent) + (p.warp_specialize is not None) + \
        (p.consumers is not None)
    return (len(stmts), stored, tile_operands, fancy, len(p.tensors), elements,
            p.BM * p.BN, p.threads, non_f32)


def shrink(program: Program, run: Callable[[Program], Verdict], target: Verdict,
           budget_s: float = 60.0, max_runs: int = 400) -> tuple[Program, Verdict, int]:
    """The smallest program found that `run` still judges like `target` (same status and
    reason), with its verdict and the number of runs spent."""
    best, verdict, runs = program, target, 0
    deadline = time.monotonic() + budget_s
    improved = True
    while improved and runs < max_runs and time.monotonic() < deadline:
        improved = False
        for candidate in candidates(best):
            if runs >= max_runs or time.monotonic() >= deadline:
                break
            if cost(candidate) >= cost(best):
                continue
            try:
                check(candidate)
            except Invalid:
                continue
            runs += 1
            v = run(candidate)
            if v.status == target.status and v.reason == target.reason:
                best, verdict, improved = candidate, v, True
                break
    return best, verdict, runs


__all__ = ["shrink", "candidates"]
