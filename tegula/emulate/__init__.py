"""tegula.emulate: run thread IR on the CPU with numpy, all threads of a block at once.

* `run_thread_kernel(kernel, grid, tensors, scalars, check_races=True)` -> `EmulationReport`
  (tensors are numpy arrays, updated in place; see `tegula.emulate.machine`).
* `EmulationError`: out-of-bounds / misaligned accesses, shared-memory races, missing
  cp.async waits or barriers, divergent barriers — compiler bugs caught on the CPU; for
  asynchronous thread IR (`lower/async_ir.py`: warp roles, mbarriers, TMA, wgmma) also
  deadlocks (every role blocked, each role's line and wait listed), reads of TMA data or
  wgmma accumulators before their wait, and missing proxy fences (`emulate/roles.py`,
  `async_state.py`, `async_ops.py`; docs/compiler.md "Emulating asynchronous code").
* `round_to`, `to_bits`, `from_bits`: the dtype rounding the emulator applies
  (`tegula.emulate.values`).
* `bank_wavefronts`: the shared-memory bank model (`tegula.emulate.memory`).
* `tegula.emulate.coverage`: which outputs a kernel writes, poisoning, and the check that
  every output element was written by some block (what `tg.emulate` runs by default).

Imports `tegula.lower` (thread IR), `tegula.arch`, `tegula.layout`, dtypes and errors.
"""
from __future__ import annotations

from tegula.emulate.errors import EmulationError
from tegula.emulate.machine import run_thread_kernel
from tegula.emulate.memory import bank_wavefronts
from tegula.emulate.stats import EmulationReport, OpStats
from tegula.emulate.values import from_bits, max_finite, round_to, storage_dtype, to_bits

__all__ = ["EmulationError", "run_thread_kernel", "bank_wavefronts", "EmulationReport",
           "OpStats", "from_bits", "max_finite", "round_to", "storage_dtype", "to_bits"]
