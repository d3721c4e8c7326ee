"""Each scalar load from a read-only tensor, read once per block of statements.

A kernel scalar loaded from memory (a page table entry, an expert offset, a sequence
length) is an index expression (`LoadScalar`), so lowering inlines it into every address
and predicate that uses it: a paged K/V copy of 64×128 f16 elements has sixteen cp.async
vectors per thread, each reading `block_table[b, j]` again. The CUDA compiler cannot merge
those reads, because every cp.async is an `asm volatile` with a memory clobber; on the
H100 they put a dependent global-memory round trip in front of each vector.

This pass binds each such load to a `Let` in front of the first statement that reads it,
and reads the variable everywhere after that in the same block (and in the blocks nested in
it). That is sound when:

* the tensor is not written by the kernel (its values cannot change between the reads);
* the statement reads the load whatever the data. A tile op reads the scalars of its
  addresses, bounds and operands wherever they sit in the lowered predicates (the
  emulator, which defines what a kernel may read, evaluates every conjunct of a predicate
  and every address, and refuses an out-of-bounds scalar load there); only a `Select`'s
  branches are read lazily, so loads inside them are never bound;
* a binding made inside a loop body, branch or role is used only inside it.
"""
from __future__ import annotations

import dataclasses
from itertools import count

from tegula.lower.thread_ir import For, If, Let, LoadScalar, Select, Stmt, Var


def bind_scalar_loads(body: list[Stmt], read_only: set[str]) -> list[Stmt]:
    """`body` with each load of a `read_only` tensor computed once per block (see above)."""
    return _LoadBinder(read_only).block(body, {})


class _LoadBinder:
    def __init__(self, read_only: set[str]) -> None:
        self.read_only = read_only
        self.names = count()
        # Expressions known to read no load, by id (the node kept alive with it): lowered
        # statements share subexpressions, and most kernels load no scalar at all, so
        # each is walked once per pass instead of once per statement that holds it.
        self.no_loads: dict[int, object] = {}

    def block(self, stmts: list[Stmt], outer: dict) -> list[Stmt]:
        bound = dict(outer)  # LoadScalar -> Var; bindings made here stay in this block
        out: list[Stmt] = []
        for s in stmts:
            for load in self._surely_read(s):
                if load not in bound:
                    value = _replace(load, bound)  # its coordinates may read bound loads
                    # tg_ names are the compiler's; not tg_ld<n>, the emitter's load temps
                    var = Var(f"tg_ld_s{next(self.names)}")
                    out.append(Let(var, value, wide=load.dtype.bits > 32))
                    bound[load] = var
            out.append(self._statement(s, bound))
        return out

    def _statement(self, s, bound: dict):
        """`s` with bound loads read from their variables; nested blocks get their own
        scope (a copy of `bound`)."""
        changes = {}
        for f in dataclasses.fields(s):
            if not f.init:
                continue
            value = getattr(s, f.name)
            if _is_block(value) and isinstance(value[0], Stmt):
                changes[f.name] = self.block(value, bound)
            elif _is_block(value):
                changes[f.name] = [self._statement(x, bound) for x in value]  # roles
            else:
                changes[f.name] = _replace(value, bound)
        return dataclasses.replace(s, **changes)

    def _surely_read(self, s) -> list[LoadScalar]:
        """Loads of read-only tensors that `s` reads whatever the data, in order."""
        if isinstance(s, For):
            fields = [s.start, s.stop]
        elif isinstance(s, If):
            fields = [s.cond]
        else:
            fields = [getattr(s, f.name) for f in dataclasses.fields(s) if f.init
                      and not _is_block(getattr(s, f.name))]
        found: list[LoadScalar] = []
        for value in fields:
            _loads_read(value, found, self.no_loads)
        return [x for x in dict.fromkeys(found) if x.tensor in self.read_only]


def _is_block(value) -> bool:
    """A nested list of statements (or of roles, which hold one each)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(x, Stmt) or (dataclasses.is_dataclass(x) and hasattr(x, "body"))
        for x in value)


def _loads_read(node, found: list, no_loads: dict) -> None:
    """Append the loads `node` reads on every path (inner ones first): all of them but
    those in a `Select`'s branches. `no_loads`: ids of nodes known to read none (skipped;
    `node` is added when it reads none)."""
    if id(node) in no_loads:
        return
    before = len(found)
    if isinstance(node, LoadScalar):
        for c in node.coords:
            _loads_read(c, found, no_loads)
        found.append(node)
    elif isinstance(node, Select):
        _loads_read(node.cond, found, no_loads)
    elif isinstance(node, (list, tuple)):
        for x in node:
            _loads_read(x, found, no_loads)
    elif dataclasses.is_dataclass(node) and not isinstance(node, (type, Stmt)):
        for f in dataclasses.fields(node):
            if f.init:
                _loads_read(getattr(node, f.name), found, no_loads)
    else:
        return  # a number, string or name: nothing to remember
    if len(found) == before:
        no_loads[id(node)] = node


def _replace(node, bound: dict):
    """`node` (an expression, value or field of a statement) with bound loads replaced."""
    if not bound:
        return node
    if isinstance(node, LoadScalar) and node in bound:
        return bound[node]
    if isinstance(node, tuple):
        return tuple(_replace(x, bound) for x in node)
    if isinstance(node, list):
        return [_replace(x, bound) for x in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, (type, Stmt)):
        fields = [f for f in dataclasses.fields(node) if f.init]
        new = {f.name: _replace(getattr(node, f.name), bound) for f in fields}
        if all(new[f.name] is getattr(node, f.name) for f in fields):
            return node
        return dataclasses.replace(node, **new)
    return node
