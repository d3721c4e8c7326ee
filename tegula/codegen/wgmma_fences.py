"""Which wgmma accumulators each operand fence names.

An operand fence (`AsyncStatements.fence_accumulators`, CUTLASS's
`warpgroup_fence_operand`) is an empty asm that reads and writes registers, so the C
compiler cannot move their accesses across it. It is printed at two places:

* right before a `WgmmaFence`: the accumulators of the wgmmas that fence opens (those
  from it to their `WgmmaCommit`), so every write of them (a zeroing, a rescale) lands
  above `wgmma.fence`;
* right after a `WgmmaWait`: the accumulators of every wgmma that may be in flight there,
  so no read of a result moves above the wait that makes it valid.

Naming more is not wrong but costs registers: the fence reads what it names, so an
accumulator named at a fence where its value is dead (attention's scores after the
softmax turned them into p, at the fence of `p @ v`) is kept alive up to it, and across
the loop when the fence is in one. So each fence names only these.

"May be in flight" is a forward data flow over the structured thread IR: a `Wgmma` adds
its accumulator arrays, a `WgmmaWait(0)` retires every committed group (a wait with
groups left pending retires nothing here: which ones it retires depends on counts the
flow does not track, and naming one more group's registers is safe), branches join by
union, a loop runs to a fixed point (what the back edge carries), and each warp role
starts from what was in flight before the roles split. A fence whose wgmmas cannot be
found before their commit in its own statement list names every accumulator of the
kernel, as all fences did before.
"""
from __future__ import annotations

from tegula.lower.async_ir import Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait
from tegula.lower.thread_ir import For, If, walk


def accumulator_arrays(body: list) -> list:
    """The register arrays any `Wgmma` of `body` accumulates into, in first-use order."""
    found: list = []
    for st in walk(body):
        for r in st.d if isinstance(st, Wgmma) else ():
            if r.array not in found:
                found.append(r.array)
    return found


def fenced_accumulators(body: list) -> dict[int, list]:
    """For every `WgmmaFence` and `WgmmaWait` of `body` (by `id`): the accumulator
    arrays its operand fence names (module docstring), in `accumulator_arrays` order."""
    every = accumulator_arrays(body)
    named: dict[int, set] = {}
    _InFlight(every, named).run(body, (frozenset(), frozenset()))
    return {key: [a for a in every if a in arrays] for key, arrays in named.items()}


class _InFlight:
    """The data flow of `fenced_accumulators`. A state is (committed, issued): the arrays
    of wgmmas committed and not known retired, and of those issued since the last
    commit (a wait never retires these)."""

    def __init__(self, every: list, named: dict[int, set]):
        self.every = every
        self.named = named

    def note(self, stmt, arrays) -> None:
        self.named.setdefault(id(stmt), set()).update(arrays)

    def run(self, stmts: list, state: tuple) -> tuple:
        committed, issued = state
        for i, s in enumerate(stmts):
            if isinstance(s, WgmmaFence):
                self.note(s, _opened_group(stmts, i, self.every))
            elif isinstance(s, Wgmma):
                issued = issued | {r.array for r in s.d}
            elif isinstance(s, WgmmaCommit):
                committed, issued = committed | issued, frozenset()
            elif isinstance(s, WgmmaWait):
                self.note(s, committed | issued)
                if s.pending == 0:
                    committed = frozenset()
            elif isinstance(s, For):
                committed, issued = self.loop(s.body, (committed, issued))
            elif isinstance(s, If):
                then = self.run(s.then, (committed, issued))
                other = self.run(s.otherwise, (committed, issued))
                committed, issued = then[0] | other[0], then[1] | other[1]
            elif hasattr(s, "roles") and isinstance(s.roles, list):   # async_ir.Roles
                ends = [self.run(role.body, (committed, issued)) for role in s.roles]
                for end in ends:
                    committed, issued = committed | end[0], issued | end[1]
        return committed, issued

    def loop(self, body: list, state: tuple) -> tuple:
        """A loop body from `state` until what reaches its head stops growing (the sets
        only grow, so this ends); the state after the loop (zero or more iterations)."""
        head = state
        while True:
            end = self.run(body, head)
            grown = (head[0] | end[0], head[1] | end[1])
            if grown == head:
                return head
            head = grown


def _opened_group(stmts: list, fence: int, every: list) -> set:
    """The accumulators of the wgmmas from the `WgmmaFence` at `stmts[fence]` to the
    `WgmmaCommit` closing them in the same list (wgmmas nested in loops or branches on
    the way included); every accumulator when no commit follows in this list."""
    arrays: set = set()
    for s in stmts[fence + 1:]:
        if isinstance(s, WgmmaCommit):
            return arrays
        for st in walk([s]):
            if isinstance(st, Wgmma):
                arrays |= {r.array for r in st.d}
    return set(every)


__all__ = ["accumulator_arrays", "fenced_accumulators"]
