"""Warp-specialized fuzz programs: GEMM-shaped programs built with `warp_specialize=True`.

The ordinary generator's GEMM programs mostly build in one role on sm_90a: small tiles
are priced below a producer warpgroup by the cost model (`synth/cost_roles.py`), and
only a pipeline written as `tg.producer` / `tg.consumer` blocks forces the split. So the
producer/consumer lowering (the stage ring's full/empty mbarriers, the producer's
`setmaxnreg`, the consumers' releases, cooperative consumer warpgroups, multicast in
clusters of two, TMA-store epilogues) was reached mostly through forced tests.

`SpecializedGenerator` draws the same kind of program — a pipelined K loop with random
tiles, types, transposed operands, clusters and epilogues — from a frame the TMA + wgmma
path takes (threads 128 or 256, BM 64 or 128, 16- and 8-bit floats, K rows of 16
bytes; a third of the K loops inside a `tg.range`, so the ring spans it and the outputs, mostly
stored straight from registers, go out through TMA-store epilogues), and asks for the
producer warpgroup (`Program.warp_specialize`), sometimes with a
consumer schedule (`Program.consumers`: "cooperative"; now and then "pingpong", which a
pipeline outside a tile loop must refuse cleanly). Near misses still occur (a tile no
wgmma covers, a transposed 8-bit operand): they must be refused with a clear error.
The runner emulates the roles under a drawn interleaving, like every program.

`python -m tegula.fuzz --specialized I --seed S` shows and reruns one; the long mode runs
one after every `SPECIALIZED_EVERY`-th program.
"""
from __future__ import annotations

import random

from tegula.fuzz.generate import Generator, Switches
from tegula.fuzz.program import Program

#: Consumer schedules asked for (None: synthesis chooses); "pingpong" is a near miss here
#: (it needs a tile loop around the pipeline) and is drawn rarely.
CONSUMERS = (None, None, None, "cooperative", "cooperative", "cooperative", "pingpong")


class SpecializedGenerator(Generator):
    """A `Generator` whose programs are all GEMM-shaped, drawn from the TMA + wgmma
    frame, and built with the producer warpgroup (module docstring)."""

    GEMM_DRAWS = {"threads": (128, 128, 256), "npot_threads": (),
                  "dtype": ("f16", "bf16", "f16", "bf16", "f8e4m3", "f8e5m2"),
                  "bm": (64, 64, 128), "bn": (16, 24, 32, 48, 64, 64, 128, 128),
                  "stages": (2, 3, 3, 4)}
    TMA_ROWS_SHARE = 1.0
    #: Mostly straight from registers: in a persistent kernel (a pipeline inside a loop,
    #: `repeat_count`) those copies become TMA-store epilogues (`synth/copies.py`).
    STORE_ROUTES = ("copy", "copy", "copy", "shared")

    def _draw(self, label: str) -> Program:
        return self.gemm_program(label)

    def repeat_count(self, stages: int) -> int:
        """A third of the pipelines run inside a `tg.range` (2 or 3 times into one accumulator):
        the TMA ring then spans the enclosing loop, as in a persistent kernel, and the
        register -> global stores after it go out through TMA-store epilogues."""
        if not self.sw.repeats or stages < 1:
            return 1
        side = random.Random(hash(self.rng.getstate()[1]) ^ 0x7E9E)
        return side.choice((2, 3)) if side.random() < 0.35 else 1

    def build_options(self, body: list) -> tuple:
        side = random.Random(hash(self.rng.getstate()[1]) ^ 0x5BEC)
        return True, side.choice(CONSUMERS)


def make_specialized_program(seed: int, index: int, switches: Switches | None = None) -> Program:
    """Warp-specialized program `index` of the run with `seed` (its own random stream)."""
    rng = random.Random(f"tegula.fuzz specialized {seed} {index}")
    return SpecializedGenerator(rng, switches).program(
        f"python -m tegula.fuzz --seed {seed} --specialized {index}")


__all__ = ["SpecializedGenerator", "make_specialized_program", "CONSUMERS"]
