"""Whether a kernel's thread-block cluster multicasts anything, and a warning where not.

`tg.cluster(x, y)` promises that a TMA box every block of the cluster loads alike is
loaded once and multicast into all of them. Only a warp-specialized TMA pipeline does
that (`synth/roles.py: decide_multicast`); a kernel whose copies take cp.async, whose
pipeline keeps one role (`warp_specialize=False`, or a body the split refuses), or whose
boxes differ between the blocks, still launches in clusters — correct, but nothing is
shared, and the blocks only wait for each other. Rather than let the author believe the
cluster pays, synthesis records why no box is multicast (`explain` prints it) and warns
once per build with `ClusterWarning`, at the `tg.cluster` line.
"""
from __future__ import annotations

import warnings

from tegula.errors import ClusterWarning
from tegula.ir.ops import Copy, ForLoop, TracedKernel, walk_ops

#: What the `default` warning filter has shown, per message and line (`warn_explicit`'s
#: registry: without one, every build would print the warning again).
_SAID: dict = {}


def why_nothing_is_multicast(kernel: TracedKernel, target) -> str:
    """Why no TMA box of `kernel` is multicast across its cluster; "" where one is (or
    the kernel declares no cluster)."""
    x, y, z = kernel.cluster
    if x * y * z == 1:
        return ""
    copies = [op for op in walk_ops(kernel.body) if isinstance(op, Copy)]
    if any(op.choices.get("multicast") is not None for op in copies):
        return ""
    pipelines = [op for op in walk_ops(kernel.body) if isinstance(op, ForLoop)
                 and any(isinstance(o, Copy) and o.choices.get("instr") == "tma"
                         for o in op.body)]
    for loop in pipelines:
        where = f"the pipeline at line {loop.loc.lineno if loop.loc else '?'}"
        if loop.choices.get("multicast_skipped"):
            return f"{where}: {loop.choices['multicast_skipped']}"
        if loop.choices.get("roles_skipped"):
            return (f"{where} is not warp-specialized ({loop.choices['roles_skipped']}); "
                    f"only a producer warpgroup's TMA ring multicasts")
    if pipelines:
        return "no TMA copy of the pipelines qualifies"
    if not target.wgmma_fma_per_clk_sm:
        return (f"the target {target.name} has no TMA pipelines into wgmma operands "
                f"(sm_90a does)")
    skipped = [op.choices["tma_skipped"] for op in copies if op.choices.get("tma_skipped")]
    if skipped:
        return f"no copy runs on TMA: {skipped[0]}"
    return ("no tg.pipeline copies global tiles into wgmma operand buffers, the only copies "
            "TMA loads (and so the only ones a cluster can multicast)")


def warn_if_nothing_is_multicast(kernel: TracedKernel, target) -> str:
    """`why_nothing_is_multicast`, warned as a `ClusterWarning` at the `tg.cluster` line."""
    why = why_nothing_is_multicast(kernel, target)
    if why:
        x, y, _ = kernel.cluster
        loc = getattr(kernel.cluster, "loc", None) or kernel.loc
        message = (f"kernel {kernel.name}: tg.cluster({x}, {y}) multicasts nothing for "
                   f"{target.name}: {why}. The blocks launch in clusters but load every "
                   f"box themselves")
        if loc is not None:  # said at the user's line, once per line and message
            warnings.warn_explicit(message, ClusterWarning, loc.filename, loc.lineno,
                                   registry=_SAID)
        else:
            warnings.warn(message, ClusterWarning, stacklevel=2)
    return why


__all__ = ["why_nothing_is_multicast", "warn_if_nothing_is_multicast"]
