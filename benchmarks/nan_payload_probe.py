"""Which NaN bit patterns a gemm accumulator holds on the GPU and in the emulator.

The fuzzer's long mode (session 11, seed 1201, programs 3500, 3638, 7908) found sm_90a
and sm_80 emulations disagreeing only in the bits of NaN accumulator elements made
visible by `tg.bitcast(acc, i32)`: 0x7fc00000 on the wgmma path, 0xffc00000 on the
mma.sync path (x86's default NaN of inf - inf leaking through numpy). This prints, for
each program, target and output, the distinct bit patterns of NaN elements (as the
outputs' own bits, or the f32 values of bitcast integers) on the GPU and in the emulator.

    PYTHONPATH=. python3 benchmarks/nan_payload_probe.py

Session 11 round 2 (H100, sm_90a): the GPU's accumulator NaN is 0x7fffffff (canonical)
where the emulator's wgmma path gives 0x7fc00000 and its mma.sync path 0xffc00000; an
sm_80 cubin does not load on the H100, so the mma.sync column needs an Ampere GPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

PROGRAMS = [(1201, 3500), (1201, 3638), (1201, 7908)]


def bits(v) -> np.ndarray:
    v = np.asarray(v)
    return v.view(np.uint32) if v.itemsize == 4 else v.view(np.uint16).astype(np.uint32)


def run(program, inputs, target, launch):
    from tegula.fuzz.runner import emulate_for
    emulated, verdict, _ = emulate_for(program, inputs, target)
    if verdict is not None:
        return None, None, f"refused: {verdict.reason}"
    try:
        return emulated, launch(program, inputs, target), ""
    except Exception as e:  # report and go on: the emulator's rows still say something
        return emulated, None, f"launch failed: {type(e).__name__}: {e}"[:100]


def main() -> None:
    from gpu_helpers import launch_fuzz_program
    from tegula.fuzz import make_program
    from tegula.fuzz.runner import data_seed, program_inputs
    print("elements where the emulated sm_90a and sm_80 runs differ (bits, hex):")
    print(f"{'program':>11} {'out':4} {'index':10} {'emu sm_90a':>11} {'emu sm_80':>11} "
          f"{'GPU sm_90a':>11} {'GPU sm_80':>11}")
    for seed, index in PROGRAMS:
        program = make_program(seed, index)
        inputs = program_inputs(program, data_seed(seed, index))
        (e9, g9, n9), (e8, g8, n8) = (run(program, inputs, t, launch_fuzz_program)
                                      for t in ("sm_90a", "sm_80"))
        for note in filter(None, (n9, n8)):
            print(f"{seed}/{index}: {note}")
        if e9 is None or e8 is None:
            continue
        for name in sorted(e9):
            differ = np.argwhere(bits(e9[name]) != bits(e8[name]))
            for at in [tuple(int(j) for j in i) for i in differ[:3]]:
                cells = [bits(x[name])[at] if x is not None else None
                         for x in (e9, e8, g9, g8)]
                shown = " ".join(f"{int(c):#010x}" if c is not None else f"{'-':>11}"
                                 for c in cells)
                print(f"{seed}/{index:>6} {name:4} {str(at):10} {shown}")


if __name__ == "__main__":
    main()
