"""SASS of the split-state selective scan, counted without a GPU (ptxas + cuobjdump): how
many instructions a chunk's loop body holds, by opcode, and the registers ptxas gives.

    python benchmarks/scan_sass.py [--dtype bf16] [--variant "FMA_CHAIN=1"] ...

Per variant (NAME=INT options of `scan_split.split_config`, "" the default), with the
bench's flags (D, z, delta_bias, softplus on): the loop's instruction count (the longest
backward branch's body: the chunk loop), MUFU by function, FFMA/FMUL/FADD, shared loads
and stores, barriers, and registers. Compare variants by these, not by speed.
"""
from __future__ import annotations

import argparse
import collections
import re

from tegula.build import build
from tegula.dtypes import bf16, f16, f32
from tegula.kernels.scan_split import selective_scan_split_kernel, split_config
from tegula.runtime.compiler import compile_cuda_report, disassemble

DTYPES = {"f32": f32, "f16": f16, "bf16": bf16}
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")


def sass_lines(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode with modifiers, operands) of each instruction."""
    return [(int(m.group(1), 16), m.group(3), m.group(4)) for m in _LINE.finditer(sass)]


def loop_body(lines: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The instructions of the largest loop: from a backward branch's target to it."""
    best: list = []
    for addr, op, args in lines:
        target = re.search(r"0x([0-9a-f]+)", args)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            body = [ln for ln in lines if int(target.group(1), 16) <= ln[0] <= addr]
            best = max(best, body, key=len)
    return best


def summary(body: list[tuple[int, str, str]]) -> str:
    ops = collections.Counter(op for _, op, _ in body)
    group = lambda prefix: sum(n for op, n in ops.items() if op.startswith(prefix))  # noqa: E731
    mufu = {op.split(".")[1]: n for op, n in ops.items() if op.startswith("MUFU")}
    return (f"{len(body)} in the loop; MUFU {group('MUFU')} {mufu}; FFMA {group('FFMA')} "
            f"FMUL {group('FMUL')} FADD {group('FADD')}; LDS {group('LDS')} STS "
            f"{group('STS')}; BAR {group('BAR')}; LDGSTS {group('LDGSTS')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", action="append", choices=tuple(DTYPES))
    parser.add_argument("--variant", action="append")
    parser.add_argument("--dstate", type=int, default=16)
    parser.add_argument("--target", default="sm_90a")
    args = parser.parse_args()
    for dtype in args.dtype or ["f32"]:
        for text in args.variant or [""]:
            tiles = {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}
            constexprs = split_config(args.dstate, **tiles)
            threads = constexprs.pop("threads")
            kernel = selective_scan_split_kernel(DTYPES[dtype], DTYPES[dtype], threads)
            flags = dict(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True)
            built = build(kernel, dict(constexprs, threads=threads, **flags), target=args.target)
            cubin, report = compile_cuda_report(built.cuda_source(), built.thread_kernel.name, args.target)
            sass = disassemble(cubin)
            body = loop_body(sass_lines(sass)) if sass else []
            steps = constexprs["BD"] * constexprs["N"] * constexprs["BL"] * constexprs["SUBS"] // threads
            print(f"{dtype} {text or 'default'}: {report.registers} registers, spills "
                  f"{report.spill_stores}/{report.spill_loads}; {summary(body)}; "
                  f"{len(body) / steps:.2f} a (state, step)", flush=True)


if __name__ == "__main__":
    main()
