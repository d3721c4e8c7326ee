"""CUDA for `tg.last_arrival` (`lower/arrivals.py: LastArrivalStmt`).

    int arrived0;
    {
        __syncthreads();                          // every thread's stores before the release
        unsigned tg_last = 0u;
        if (threadIdx.x == 0) {
            if (!(in bounds) || count < 1) __trap();
            unsigned tg_old;
            atom.acq_rel.gpu.global.inc.u32 tg_old, [counter], count - 1;
            if (tg_old >= count) __trap();        // a counter not zeroed, or counts that differ
            tg_last = tg_old == count - 1;
        }
        bar.red.or.pred -> arrived0               // broadcast; orders the acquire first
    }

A trap is a launch error the caller sees; returning "not last" there instead would leave
no block to finish the work and the output unwritten, silently.
"""
from __future__ import annotations

from tegula.arch.arrivals import ATOM_INC_ACQ_REL, BAR_RED_OR
from tegula.codegen.expr import CodegenError, index_c


def emit_last_arrival(emitter, s) -> None:
    """Print statement `s` (a LastArrivalStmt) through `emitter` (the CUDA emitter)."""
    ptr, dtype = emitter.global_address(s.tensor, s.index)
    if dtype.name != "i32":
        raise CodegenError(f"last_arrival: the counter {s.tensor} is {dtype}, not i32")
    count = emitter.temp("count")
    last, old = emitter.temp("last"), emitter.temp("old")
    inside = index_c(s.pred) if s.pred is not None else "1"
    line = emitter.line
    line(f"int {s.var.name};")
    line("{")
    emitter.depth += 1
    line("__syncthreads();  // every thread's stores precede thread 0's release")
    line(f"const unsigned {count} = (unsigned)({index_c(s.count)});")
    line(f"unsigned {last} = 0u;")
    line("if (threadIdx.x == 0) {")
    emitter.depth += 1
    line(f"if (!({inside}) || (int){count} < 1) __trap();  // no counter element to arrive on")
    line(f"unsigned {old};")
    line(ATOM_INC_ACQ_REL.format_asm(d=old, addr=f"(unsigned*){ptr}", b=f"{count} - 1u"))
    line(f"if ({old} >= {count}) __trap();  // the counter was not in 0 .. count-1")
    line(f"{last} = {old} == {count} - 1u;")
    emitter.depth -= 1
    line("}")
    result = emitter.temp("arrived")
    line(f"unsigned {result};")
    line(BAR_RED_OR.format_asm(d=result, a=last))
    line(f"{s.var.name} = (int){result};")
    emitter.depth -= 1
    line("}")


__all__ = ["emit_last_arrival"]
