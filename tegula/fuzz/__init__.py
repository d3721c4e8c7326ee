"""tegula.fuzz: a differential fuzzer for the compiler.

It draws random tile programs (`generate`: element-wise chains over every operator, math
function and type, `where` with tiles and numbers, casts, reductions and cumulative sums
(`tg.cumsum`, forward and reversed) on either axis (also inside loops, folded into the
loop's carried tiles),
copies between every pair of scopes with and without `fill`, ragged shapes, tiles smaller
than the block, thread counts that are not powers of two, loops whose state is updated in
place and by rebinding), writes each as kernel source (`source`), runs it in the emulator
on random data with NaN and infinities for each target (`runner.TARGETS`: sm_90a, whose
GEMM-shaped programs take TMA + wgmma — with operands stored transposed too, MN-major, in
clusters of two blocks, and pipelines written as `tg.producer` / `tg.consumer` blocks —
and warp roles and clustered blocks run in an interleaving
drawn per program, and sm_80's cp.async + mma.sync),
and compares
every output element with an independent numpy model of the program (`reference`, on `numerics`: rounding written
from the formats' definitions, error bounds for math functions and reductions) and the targets with each
other (bit for bit where the arithmetic's order is fixed). Failures
shrink to a minimal kernel (`shrink`). `python -m tegula.fuzz --minutes N` is the long
mode; tests/fuzz runs a seeded sample in CI and tests/gpu/test_fuzz_gpu.py compares the
GPU with the emulator on the same programs. `tile_loops` draws persistent tile loops with
random tile maps and global reads (which ping-pong consumers must not split) and checks
them against a sequential model; the long mode runs one every few programs. Pipelines
that state no warp roles may ask for `warp_specialize=` / `consumers=` (`Program`), and
`specialized` draws GEMM programs built with the producer warpgroup, which the cost model
would mostly keep in one role (a third of them persistent: a tile loop over the output
tiles with the body inside, on ping-pong consumer warpgroups where it applies); the long
mode runs one every few programs too.

Like `tegula.cli`, this package sits above the compiler and uses it only through the
public language (`tegula.lang`) and `tg.emulate` (`tegula.build`).
"""
from __future__ import annotations

import random

from tegula.fuzz.generate import Generator, Switches
from tegula.fuzz.program import Program
from tegula.fuzz.reference import Features
from tegula.fuzz.runner import TARGETS, Tally, Verdict, data_seed, run_program
from tegula.fuzz.specialized import make_specialized_program


def make_program(seed: int, index: int, switches: Switches | None = None) -> Program:
    """Program `index` of the run with `seed` (each drawn from its own random stream, so
    one program can be regenerated alone)."""
    rng = random.Random(f"tegula.fuzz {seed} {index}")
    return Generator(rng, switches).program(f"python -m tegula.fuzz --seed {seed} "
                                            f"--program {index}")


def fuzz_program(program: Program, seed: int, index: int,
                 features: Features | None = None, targets: tuple = TARGETS,
                 role_order: str = "random") -> Verdict:
    """Run `program` on the inputs of program `index` of the run with `seed`, for each
    of `targets` (against numpy and against each other), warp roles in `role_order`
    (`runner.ROLE_ORDERS`)."""
    return run_program(program, data_seed(seed, index), features, targets, role_order)


def fuzz(seed: int, count: int, switches: Switches | None = None,
         features: Features | None = None, targets: tuple = TARGETS,
         role_order: str = "random") -> tuple[Tally, list]:
    """Run programs 0..count-1 of `seed`: the tally and the failures
    [(index, program, verdict)]."""
    tally, failures = Tally(), []
    for index in range(count):
        program = make_program(seed, index, switches)
        verdict = fuzz_program(program, seed, index, features, targets, role_order)
        tally.add(verdict)
        if verdict.failed:
            failures.append((index, program, verdict))
    return tally, failures


__all__ = ["make_program", "make_specialized_program", "fuzz_program", "fuzz", "Generator", "Switches", "Features",
           "Program", "Verdict", "Tally", "TARGETS"]
