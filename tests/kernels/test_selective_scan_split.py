"""The split-state selective scan (tegula.kernels.scan_split: each channel's states split over
G threads, every thread walking its steps in order) in the emulator against Mamba's reference
loop (numpy, float64), every element: ragged last chunks, channel counts that do not divide
the block, dstate not divisible by 4 (G = 2 or 1), every option, f16/bf16 inputs with f32 or
16-bit B and C, NaN propagation, the tile options; then the choice between the two kernels
and its errors."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16
from tegula.emulate.values import round_to
from tegula.kernels.scan import selective_scan_emulated, selective_scan_reference
from tegula.kernels.scan_split import split_config

from .test_selective_scan import assert_close, inputs

ALL = dict(delta_softplus=True)


@pytest.mark.parametrize("batch,dim,length,dstate,tiles", [
    (2, 40, 37, 16, {}),                  # 2 chunks of 32 (last ragged), 40 channels / 16
    (1, 33, 50, 5, {}),                   # dstate 5: G = 1, 128 channels a block, BL 8
    (1, 3, 9, 7, {}),                     # dstate 7, one ragged chunk, 3 of 128 channels
    (2, 3, 20, 1, {}),                    # dstate 1
    (1, 6, 1, 16, {}),                    # one step
    (3, 70, 41, 12, {}),                  # 3 states a thread (G = 4)
    (1, 20, 45, 16, dict(G=4)),           # 4 states a thread, 32 channels a block
    (1, 20, 45, 16, dict(threads=64)),    # 16 channels a block of 64 threads
    (2, 19, 41, 16, dict(G=8, BD=16)),    # 2 states a thread
    (1, 70, 41, 16, dict(G=2, BD=64, BL=8)),
    (1, 40, 70, 16, dict(BL=32, STAGES=3)),
    (1, 9, 23, 6, dict(G=2, BL=4)),       # BL 4: one output run per channel
    (2, 19, 41, 16, dict(G=16, BL=16, STAGES=4)),   # 1 state a thread, runs of 1 step
    (1, 11, 70, 16, dict(threads=64, STAGES=4)),    # 8 channels a block, 3 chunks ahead
    (1, 5, 75, 16, dict(SUBS=2)),         # two sub-chunks a step, the second of the last ragged
])
def test_all_options_equal_reference(batch, dim, length, dstate, tiles):
    u, delta, A, B, C, D, z, bias = inputs(batch, dim, length, dstate, seed=dim + length)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, SPLIT=True, **ALL, **tiles)
    want = selective_scan_reference(u, delta, A, B, C, D, z, bias, **ALL)
    assert out.shape == u.shape and out.dtype == np.float32
    assert_close(out, want, 1e-5)


@pytest.mark.parametrize("options", [dict(), dict(D=True), dict(z=True),
                                     dict(delta_bias=True, delta_softplus=True)])
def test_each_option_alone(options):
    u, delta, A, B, C, D, z, bias = inputs(1, 9, 50, 16, seed=3)
    given = dict(D=D if options.get("D") else None, z=z if options.get("z") else None,
                 delta_bias=bias if options.get("delta_bias") else None,
                 delta_softplus=options.get("delta_softplus", False))
    out = selective_scan_emulated(u, delta, A, B, C, SPLIT=True, **given)
    assert_close(out, selective_scan_reference(u, delta, A, B, C, **given), 1e-5)


def test_f16_inputs():
    u, delta, A, B, C, D, z, bias = inputs(2, 40, 37, 16, dtype=np.float16, seed=7)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, SPLIT=True, **ALL)
    assert out.dtype == np.float16
    # f32 math, one rounding to f16 (half an ulp: ~5e-4 relative)
    assert_close(out, selective_scan_reference(u, delta, A, B, C, D, z, bias, **ALL), 2e-3)


def test_bf16_inputs_in_float32_arrays():
    u, delta, A, B, C, D, z, bias = (round_to(x, bf16) if x.ndim == 3 else x
                                     for x in inputs(1, 40, 40, 16, seed=9))
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, dtype=bf16, SPLIT=True, **ALL)
    np.testing.assert_array_equal(out, round_to(out, bf16))
    assert_close(out, selective_scan_reference(u, delta, A, B, C, D, z, bias, **ALL), 1e-2)


def test_f32_B_and_C_with_f16_u():
    """B and C already f32 (no conversion pass) under 16-bit u and delta."""
    u, delta, A, B, C, D, z, bias = inputs(1, 8, 33, 16, seed=11)
    u16, delta16 = u.astype(np.float16), delta.astype(np.float16)
    out = selective_scan_emulated(u16, delta16, A, B, C, D, SPLIT=True)
    assert_close(out, selective_scan_reference(u16, delta16, A, B, C, D), 2e-3)


@pytest.mark.parametrize("where", ["u", "delta", "B"])
def test_nan_propagates_along_the_sequence_only(where):
    """A NaN at step t poisons its channel's state from t on (every channel for B)."""
    u, delta, A, B, C, D, z, bias = inputs(2, 40, 60, 16, seed=13)
    given = dict(u=u, delta=delta, B=B)
    given[where] = given[where].copy()
    given[where][1, 3, 37] = np.nan           # step 37: the second chunk of 32
    args = (given["u"], given["delta"], A, given["B"], C, D, z, bias)
    out = selective_scan_emulated(*args, SPLIT=True, **ALL)
    want = selective_scan_reference(*args, **ALL)
    expect_nan = np.zeros(out.shape, bool)
    expect_nan[1, slice(None) if where == "B" else 3, 37:] = True
    np.testing.assert_array_equal(np.isnan(out), expect_nan)
    ok = ~expect_nan
    assert np.abs(out[ok] - want[ok]).max() <= 1e-5 * np.abs(want[ok]).max()


def test_split_config_defaults_and_refusals():
    assert split_config(16) == dict(N=16, BD=16, BL=32, G=8, STAGES=3, threads=128,
                                    FMA_CHAIN=False, SUBS=1)
    assert split_config(6)["G"] == 2 and split_config(7)["G"] == 1
    assert split_config(64)["BL"] == 8 and split_config(5)["BL"] == 8
    assert split_config(16, blocks_per_sm=3)["blocks_per_sm"] == 3
    for bad in (dict(G=3), dict(BD=32), dict(BL=12), dict(BL=2), dict(SUBS=0)):
        with pytest.raises(ValueError, match="split-state kernel needs"):
            split_config(16, **bad)


def test_default_kernel_by_size_and_type():
    """16-bit inputs with fewer split-kernel blocks than SMs run the lane scan by default
    (1x2048x2048 bf16: 128 blocks); f32 and larger grids the split kernel; a named option
    of either kernel decides."""
    from tegula.dtypes import f16, f32
    from tegula.kernels.scan import SPLIT_MIN_BLOCKS_16BIT, selective_scan_launch_config
    assert SPLIT_MIN_BLOCKS_16BIT == 132
    assert not selective_scan_launch_config(2048, 16, bf16, 1)[0]
    assert not selective_scan_launch_config(2048, 16, f16, 1)[0]
    assert selective_scan_launch_config(2048, 16, f32, 1)[0]
    assert selective_scan_launch_config(1000, 16, bf16, 3)[0]      # 189 blocks
    assert selective_scan_launch_config(2112, 16, bf16, 1)[0]      # 132 blocks
    assert selective_scan_launch_config(2097, 16, bf16, 1)[0]      # 132, the last ragged
    assert not selective_scan_launch_config(2096, 16, bf16, 1)[0]  # 131 blocks
    assert selective_scan_launch_config(2048, 16, bf16, 1, STAGES=2)[0]
    assert selective_scan_launch_config(2048, 16, bf16, 1, SPLIT=True)[0]


@pytest.mark.parametrize("chain", [False, True])
def test_fma_chain_either_way(chain):
    """The recurrence's add with δu·B fused (FMA_CHAIN=False) or a·h fused (True): the same
    result within f32 rounding, NaN poisoned outputs written."""
    u, delta, A, B, C, D, z, bias = inputs(2, 21, 45, 16, seed=21)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, SPLIT=True, FMA_CHAIN=chain,
                                  **ALL)
    assert_close(out, selective_scan_reference(u, delta, A, B, C, D, z, bias, **ALL), 1e-5)


def test_kernel_choice_errors():
    """Options of one kernel under the other are refused, not dropped."""
    u, delta, A, B, C, D, z, bias = inputs(1, 4, 10, 4)
    with pytest.raises(ValueError, match="GROUP are options of the lane-scan kernel"):
        selective_scan_emulated(u, delta, A, B, C, SPLIT=True, GROUP=2)
    with pytest.raises(ValueError, match="G, STAGES are options of the split-state kernel"):
        selective_scan_emulated(u, delta, A, B, C, SPLIT=False, G=2, STAGES=3)


@pytest.mark.parametrize("dtype,tiles", [("f32", {}), ("bf16", {}), ("f32", dict(threads=64)),
                                         ("bf16", dict(SUBS=2))])
def test_cuda_compiles_for_sm90a(dtype, tiles):
    from tegula.build import build
    from tegula.dtypes import f32
    from tegula.kernels.scan_split import selective_scan_split_kernel
    from tegula.runtime.compiler import available_compilers, compile_cuda
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    dt = f32 if dtype == "f32" else bf16
    constexprs = dict(split_config(16, **tiles), HAS_D=True, HAS_Z=True, HAS_BIAS=True,
                      SOFTPLUS=True)
    kernel = selective_scan_split_kernel(dt, dt, constexprs.pop("threads"))
    source = build(kernel, constexprs, target="sm_90a").cuda_source()
    assert compile_cuda(source, "selective_scan_split", "sm_90a")[:4] == b"\x7fELF"
