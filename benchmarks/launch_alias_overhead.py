"""What the launch-time aliasing check (`tegula/runtime/aliasing.py`) costs a replayed
launch: host µs per `kernel[grid](...)` with the check and with it taken out of the same
prepared launch, runs interleaved (`launch_overhead.host_runs`: 200 back-to-back calls
timed before the synchronize, best and median of 40), in one process.

    PYTHONPATH=. python3 benchmarks/launch_alias_overhead.py      # on a GPU

Kernels: the library's 2-D copy (one checked pair: y against x) and a three-tensor add
(z against x and y: two pairs). Before timing, each is run once on its own correctness
case (poisoned output, every element compared), and an overlapping launch must raise.
The target (issue: correctness): under 1 µs per launch.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tegula as tg  # noqa: E402
from tegula.dtypes import f16  # noqa: E402
from tegula.errors import LaunchError  # noqa: E402
from tegula.kernels.copy import copy_kernel  # noqa: E402
from tegula.runtime.launcher import _NOT_YET  # noqa: E402

from launch_overhead import host_runs  # noqa: E402


def add_kernel():
    @tg.kernel(threads=128)
    def add3(x: tg.Tensor[f16], y: tg.Tensor[f16], z: tg.Tensor[f16],
             BM: tg.constexpr = 32, BN: tg.constexpr = 64):
        n, m = tg.block_id(0), tg.block_id(1)
        a = tg.load(x.tile((BM, BN), (m, n)))
        b = tg.load(y.tile((BM, BN), (m, n)))
        tg.copy(a + b, z.tile((BM, BN), (m, n)))
    return add3


def without_check(kernel):
    """The kernel's prepared launches with the alias check removed (`aliases` None, the
    C spec rebuilt without its pairs)."""
    for prepared in kernel.__dict__["_fast_launch"].values():
        prepared.aliases = None
        prepared.direct = _NOT_YET


def main() -> None:
    import torch

    storage = torch.randn(128 * 64, device="cuda", dtype=torch.float16)
    x = storage[:4096].view(64, 64)
    overlapping = storage[64:64 + 4096].view(64, 64)  # x's rows 1.. and one more row
    y = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    grid = (1, 2)
    rows = []
    for name, make, args in [("copy (1 pair)", lambda: copy_kernel(f16), (x,)),
                             ("add3 (2 pairs)", add_kernel, (x, y))]:
        checked, unchecked = make(), make()
        out = torch.full((64, 64), float("nan"), device="cuda", dtype=torch.float16)
        checked[grid](*args, out)
        torch.cuda.synchronize()
        want = args[0] if len(args) == 1 else args[0] + args[1]
        bad = int((out != want).sum())
        try:  # a replay (same key as the launch above): the C check finds it
            checked[grid](*args, overlapping)
            refused = "no"
        except LaunchError:
            refused = "yes"
        out2 = torch.empty_like(out)
        unchecked[grid](*args, out2)
        without_check(unchecked)
        fns = [lambda: checked[grid](*args, out), lambda: unchecked[grid](*args, out2)]
        with_runs, without_runs = host_runs(fns)
        rows.append((name, bad, refused, min(with_runs), statistics.median(with_runs),
                     min(without_runs), statistics.median(without_runs)))
    print(f"{'kernel':16} {'wrong':>5} {'overlap refused':>15} {'with us best/med':>17} "
          f"{'without us best/med':>20} {'cost us (median)':>17}")
    for name, bad, refused, wb, wm, ob, om in rows:
        print(f"{name:16} {bad:5d} {refused:>15} {wb:8.3f}/{wm:7.3f} {ob:10.3f}/{om:8.3f} "
              f"{wm - om:17.3f}")


if __name__ == "__main__":
    main()
