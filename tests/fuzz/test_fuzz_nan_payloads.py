"""A NaN in a gemm accumulator has the GPU's bits on every emulated path. The fuzzer's long
mode (session 11, seed 1201, programs 3500 / 3638 / 7908) made NaN accumulator elements
visible through `tg.bitcast` and found sm_90a (wgmma) and sm_80 (mma.sync) emulations
disagreeing in their bits: numpy kept x86's NaN of whichever operation made it. Both
paths now write the tensor cores' canonical NaN (`arch.formats.tensor_core_nan`), the
0x7fffffff the H100's wgmma writes (`benchmarks/nan_payload_probe.py`)."""
from __future__ import annotations

import numpy as np

from tegula.arch.formats import tensor_core_nan
from tegula.arch.wgmma import get_wgmma
from tegula.fuzz import fuzz_program, make_program


def test_canonical_nan_replaces_every_payload_and_keeps_everything_else():
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x3F800000, 0x7F800000, 0x80000000],
                    dtype=np.uint32)
    out = tensor_core_nan(bits.view(np.float32)).view(np.uint32)
    assert out.tolist() == [0x7FFFFFFF] * 3 + [0x3F800000, 0x7F800000, 0x80000000]
    half = np.array([0x7E00, 0xFE00, 0x3C00], dtype=np.uint16).view(np.float16)
    assert tensor_core_nan(half).view(np.uint16).tolist() == [0x7FFF, 0x7FFF, 0x3C00]


def test_the_wgmma_entry_writes_the_canonical_nan_for_inf_times_zero():
    instr = get_wgmma("wgmma.m64n8k16.f32.f16.f16")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, instr.k)).astype(np.float16).astype(np.float64)
    b = rng.standard_normal((8, instr.k)).astype(np.float16).astype(np.float64)
    a[5, 0], b[3, 0] = np.inf, 0.0          # inf * 0 = NaN in element (5, 3)
    a[7, 1], b[2, 1] = np.inf, -np.inf      # -inf in row 7 ...
    a[7, 2], b[2, 2] = np.inf, np.inf       # ... plus inf: NaN in element (7, 2)
    out = instr.execute(None, a, b, 0)
    nan = np.isnan(out)
    assert nan[5, 3] and nan[7, 2]
    assert (out.view(np.uint32)[nan] == 0x7FFFFFFF).all()


def test_the_long_mode_programs_that_found_it_agree_between_targets():
    for index in (3500, 3638, 7908):
        result = fuzz_program(make_program(1201, index), 1201, index)
        assert result.status in ("pass", "rejected"), (index, result.status)
