"""Warp-specialized fuzz programs: GEMM-shaped programs built with `warp_specialize=True`.

The ordinary generator's GEMM programs mostly build in one role on sm_90a: small tiles
are priced below a producer warpgroup by the cost model (`synth/cost_roles.py`), and
only a pipeline written as `tg.producer` / `tg.consumer` blocks forces the split. So the
producer/consumer lowering (the stage ring's full/empty mbarriers, the producer's
`setmaxnreg`, the consumers' releases, cooperative consumer warpgroups, multicast in
clusters of two, TMA-store epilogues) was reached mostly through forced tests.

`SpecializedGenerator` draws the same kind of program — a pipelined K loop with random
tiles, types, transposed operands, clusters and epilogues — from a frame the TMA + wgmma
path takes (threads 128 or 256, BM 64 or 128 — 128 for 256 threads, one warpgroup's 64
rows each —, 16- and 8-bit floats, K rows of 16 bytes, operands stored transposed read
through a shared `.T` view), and asks for the producer warpgroup
(`Program.warp_specialize`), sometimes with a consumer schedule (`Program.consumers`).
A third of the programs are **persistent** (`Program.persistent`): P blocks walk the
output tiles in a tile loop with the whole body inside, so `consumers="pingpong"` (asked
for, or synthesis's default) gives two consumer warpgroups taking whole tiles in turn,
each running the random epilogue of its tile while the other's wgmmas run; their loads
and stores then mostly stay off shared memory, which both warpgroups cannot share. Of the
others, a third run their K loop inside a `tg.range` (2 or 3 times into one accumulator),
so the ring spans it and the outputs, mostly stored straight from registers, go out
through TMA-store epilogues.

Near misses are drawn on purpose, now and then (about one program in seven): a
transposing copy through a global `.T` view (no TMA box), an 8-bit MN-major operand, rows
not a multiple of 16 bytes, a 64-row tile on two warpgroups, ping-pong asked for outside
a tile loop, a stated schedule the build option contradicts, register budgets over the
register file. Each must be refused with a clear error naming the line.
The runner emulates the roles under a drawn interleaving, like every program.

`python -m tegula.fuzz --specialized I --seed S` shows and reruns one; the long mode runs
one after every `SPECIALIZED_EVERY`-th program.
"""
from __future__ import annotations

import random

from tegula.fuzz.generate import GEMM_ELEMENT_BYTES, Generator, Switches
from tegula.fuzz.program import Gemm, Program

#: Consumer schedules asked for (None: synthesis chooses) outside a tile loop; "pingpong"
#: there is a near miss (it needs the tile loop, or two gemms for turns inside the K loop).
CONSUMERS = (None, None, None, "cooperative", "cooperative", "cooperative")
#: ... and in a persistent tile loop, where ping-pong applies (one warpgroup's tile).
TILE_LOOP_CONSUMERS = (None, "pingpong", "pingpong", "cooperative")
#: Share of programs drawn persistent, and how many blocks walk their tiles.
PERSISTENT_SHARE = 0.35
PERSISTENT_BLOCKS = (1, 2, 2, 3)
#: Shares of the near misses (see the module docstring).
NEAR_MISS = {"gmem_transposed": 0.1, "f8_transposed": 0.1, "wide_tile": 0.03,
             "pingpong_outside": 0.04, "contradiction": 0.1, "over_budget": 0.15}
#: The producer's registers a thread where the source leaves its budget to synthesis.
DEFAULT_PRODUCER_REGS = 40


class SpecializedGenerator(Generator):
    """A `Generator` whose programs are all GEMM-shaped, drawn from the TMA + wgmma
    frame, and built with the producer warpgroup (module docstring)."""

    GEMM_DRAWS = {"threads": (128, 128, 256), "npot_threads": (),
                  "dtype": ("f16", "bf16", "f16", "bf16", "f8e4m3", "f8e5m2"),
                  "bm": (64, 64, 128), "bn": (16, 24, 32, 48, 64, 64, 128, 128),
                  "stages": (2, 3, 3, 4)}
    TMA_ROWS_SHARE = 1.0
    TRANSPOSED_ROWS_SHARE = 0.95
    #: Mostly straight from registers: in a persistent kernel (a pipeline inside a loop,
    #: `repeat_count`) those copies become TMA-store epilogues (`synth/copies.py`).
    STORE_ROUTES = ("copy", "copy", "copy", "shared")

    def _draw(self, label: str) -> Program:
        return self.gemm_program(label)

    def _side(self, salt: int) -> random.Random:
        """A stream of its own for one choice, seeded by the program's stream without
        drawing from it."""
        return random.Random(hash(self.rng.getstate()[1]) ^ salt)

    def tile_loop_blocks(self) -> int:
        side = self._side(0x7111)
        return side.choice(PERSISTENT_BLOCKS) if side.random() < PERSISTENT_SHARE else 0

    def tile_fits(self, threads: int, bm: int, bn: int) -> bool:
        """Two consumer warpgroups split the tile's rows, 64 each: a 64-row tile on 256
        threads has no wgmma layout (a near miss, kept now and then)."""
        return not (threads == 256 and bm < 128) or \
            self.rng.random() < NEAR_MISS["wide_tile"]

    def transposed_read(self, dtype: str, route: str) -> str:
        """Mostly through a shared `.T` view (an MN-major wgmma operand the producer loads
        by TMA boxes); a global `.T` view (a transposing copy: no TMA box) and 8-bit
        MN-major operands (wgmma has none) are near misses."""
        r = self.rng
        eight_bit = dtype not in GEMM_ELEMENT_BYTES
        share = 0.4 * (NEAR_MISS["f8_transposed"] if eight_bit else 1.0)
        if not self.sw.transposed_gemm or r.random() >= share:
            return ""
        smem = route == "shared" and r.random() >= NEAR_MISS["gmem_transposed"]
        return "smem" if smem else "gmem"

    def repeat_count(self, stages: int) -> int:
        """A third of the pipelines of one block a tile run inside a `tg.range` (2 or 3
        times into one accumulator): the TMA ring then spans the enclosing loop, as in a
        persistent kernel, and the register -> global stores after it go out through
        TMA-store epilogues. A persistent program's pipeline stays directly in its tile
        loop (where ping-pong can split the tiles)."""
        if not self.sw.repeats or stages < 1 or self.in_tile_loop:
            return 1
        side = self._side(0x7E9E)
        return side.choice((2, 3)) if side.random() < 0.35 else 1

    def pingpong_fits(self) -> bool:
        """Ping-pong's frame: a persistent tile loop, one warpgroup's tile (128 threads)."""
        return self.in_tile_loop and self.threads == 128

    def role_blocks(self, stages: int, p: float) -> tuple:
        """The stated roles of `Generator.role_blocks`; outside ping-pong's frame a stated
        "pingpong" schedule is mostly "cooperative" (ping-pong there is a near miss)."""
        roles = super().role_blocks(stages, p)
        if roles and roles[2] == "pingpong" and not self.pingpong_fits() and \
                self._side(0x5C4E).random() >= NEAR_MISS["pingpong_outside"]:
            roles = roles[:2] + ("cooperative",)
        if roles and self.over_budget(*roles) and \
                self._side(0xB0D6).random() >= NEAR_MISS["over_budget"]:
            roles = (None, None, roles[2])
        return roles

    def over_budget(self, producer, consumer, schedule) -> bool:
        """Whether stated budgets ask for more than the block's register file (producer
        warpgroup + consumers; two consumer warpgroups of 128 threads on ping-pong):
        128 p + T c > (T + 128) * the per-thread share, as `tg.consumer(regs=)` says."""
        if producer is None and consumer is None:
            return False
        pingpong = schedule == "pingpong" or (schedule is None and self.pingpong_fits())
        threads = 2 * self.threads if pingpong and self.threads == 128 else self.threads
        total = threads + 128
        share = min(255, 65536 // total) // 8 * 8
        default = 232 if threads == 256 else share   # synthesis's consumer budget
        asked = 128 * (producer or DEFAULT_PRODUCER_REGS) + threads * (consumer or default)
        return asked > total * share

    def build_options(self, body: list) -> tuple:
        """(True, a consumer schedule): ping-pong mostly in its frame; where the source
        states a schedule, mostly none (the two must agree: a contradiction is a near
        miss)."""
        side = self._side(0x5BEC)
        stated = next((s.roles[2] for s in body if isinstance(s, Gemm) and s.roles), None)
        if stated is not None and side.random() >= NEAR_MISS["contradiction"]:
            return True, None
        if self.pingpong_fits():
            return True, side.choice(TILE_LOOP_CONSUMERS)
        if side.random() < NEAR_MISS["pingpong_outside"]:
            return True, "pingpong"
        return True, side.choice(CONSUMERS)


def make_specialized_program(seed: int, index: int, switches: Switches | None = None) -> Program:
    """Warp-specialized program `index` of the run with `seed` (its own random stream)."""
    rng = random.Random(f"tegula.fuzz specialized {seed} {index}")
    return SpecializedGenerator(rng, switches).program(
        f"python -m tegula.fuzz --seed {seed} --specialized {index}")


__all__ = ["SpecializedGenerator", "make_specialized_program", "CONSUMERS",
           "TILE_LOOP_CONSUMERS"]
