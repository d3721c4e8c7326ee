"""Bytes of weights in flight per SM, and warps per scheduler, of W4A16 variants at a
shape — counted on the host before timing (nvcc/NVRTC and cuobjdump; no GPU):
`python benchmarks/w4a16_inflight.py [--shape 1x14336x4096 ...]`.

For each variant it compiles the sm_90a build, reads its registers per thread
(cuobjdump -res-usage) and the shared memory synthesis gives it, and derives the blocks
an SM holds (registers in 256-register warp units, shared memory with 1 KB a block
reserved, 2048 threads, 32 blocks; an H100 SM: 64K registers, 228 KB) and the blocks the
grid gives an SM (`min(holds, ceil(blocks / 132))`). Weights in flight are the loads a
block has issued and not yet consumed: a cp.async ring's STAGES − 1 stages of weight
words (its activations are not counted: they come from L2), the GEMV kernel's two steps
ahead in registers (16 bytes a stored block a thread). Little's law wants about
bandwidth × latency / SMs ≈ 3.35 TB/s × ~1 µs / 132 ≈ 25 KB an SM.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMS, REGISTERS, SHARED, THREADS, BLOCKS = 132, 65536, 228 * 1024, 2048, 32
GROUP = 128
_SA = dict(FRAGMENT=1, BT=16, load_path="cp.async", INTEGER_ZEROS=1, SCALE_AFTER=1,
           warp_specialize=False)
# (label, kind, constexprs): the tensor-core kernel's session-12 picks, then the GEMV's
VARIANTS = [
    ("frag KS4 S6 unsplit", "fragment", dict(_SA, KS=4, STAGES=6)),
    ("frag KS4 S4 WG2", "fragment", dict(_SA, KS=4, STAGES=4, WG=2)),
    ("frag KS4 S3 split4", "fragment", dict(_SA, KS=4, STAGES=3, SPLIT=4)),
    ("gemv KS8 KW8", "gemv", dict(GEMV=1, INTEGER_ZEROS=1, KS=8, KW=8)),
    ("gemv KS8 KW4", "gemv", dict(GEMV=1, INTEGER_ZEROS=1, KS=8, KW=4)),
    ("gemv KS16 KW8", "gemv", dict(GEMV=1, INTEGER_ZEROS=1, KS=16, KW=8)),
    ("gemv KS16 KW4", "gemv", dict(GEMV=1, INTEGER_ZEROS=1, KS=16, KW=4)),
    ("gemv KS32 KW8", "gemv", dict(GEMV=1, INTEGER_ZEROS=1, KS=32, KW=8)),
]


def registers(cuda: str, name: str, sm: str) -> int:
    from tegula.runtime.compiler import compile_cuda, find_cuobjdump
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compile_cuda(cuda, name, sm))
        f.flush()
        out = subprocess.run([find_cuobjdump(), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", out).group(1))


def account(m: int, n: int, k: int, kind: str, tiles: dict) -> dict:
    from tegula.build import build
    from tegula.dtypes import f16
    from tegula.kernels.quant import w4a16_config, w4a16_kernel
    from tegula.kernels.quant_fragment import w4a16_fragment_kernel
    _, grid, constexprs = w4a16_config(m, n, k, GROUP, **tiles)
    split = constexprs.pop("SPLIT", 1)
    kernel = (w4a16_fragment_kernel(f16, True, partial=split > 1) if kind == "fragment"
              else w4a16_kernel(kind, f16, True))
    result = build(kernel, constexprs, target="sm_90a")
    threads = result.thread_kernel.threads
    regs = registers(result.cuda_source(), result.thread_kernel.name, result.target.sm)
    warp_regs = -(-regs * 32 // 256) * 256
    holds = min(REGISTERS // (warp_regs * (threads // 32)),
                SHARED // (result.thread_kernel.shared_bytes + 1024), THREADS // threads,
                BLOCKS)
    blocks = 1
    for extent in grid:
        blocks *= extent
    resident = min(holds, -(-blocks // SMS))
    if kind == "fragment":
        stage = 64 * tiles.get("WG", 1) * 64 * tiles["KS"] // 2
        per_block = (tiles["STAGES"] - 1) * stage
    else:
        per_block = 2 * 16 * (tiles["KS"] // tiles["KW"]) * threads
    return dict(regs=regs, threads=threads, smem=result.thread_kernel.shared_bytes,
                holds=holds, blocks=blocks, resident=resident,
                warps=resident * threads / 32 / 4, inflight=resident * per_block)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=None, help="MxNxK (repeatable)")
    args = parser.parse_args()
    shapes = args.shape or ["1x14336x4096", "1x4096x4096"]
    print(f"{'shape':14} {'variant':20} {'regs':>4} {'thr':>4} {'smem KB':>7} {'holds':>5} "
          f"{'blocks':>6} {'an SM':>5} {'warps/sched':>11} {'in flight KB/SM':>15}")
    for text in shapes:
        m, n, k = (int(x) for x in text.split("x"))
        for label, kind, tiles in VARIANTS:
            r = account(m, n, k, kind, tiles)
            print(f"{text:14} {label:20} {r['regs']:4d} {r['threads']:4d} "
                  f"{r['smem'] / 1024:7.1f} {r['holds']:5d} {r['blocks']:6d} "
                  f"{r['resident']:5d} {r['warps']:11.1f} {r['inflight'] / 1024:15.1f}",
                  flush=True)
    print("in flight: weight bytes loaded and not yet consumed a resident SM's blocks hold "
          "(Little's law: ~25 KB an SM for 3.35 TB/s at ~1 µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
