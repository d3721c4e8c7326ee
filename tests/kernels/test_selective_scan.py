"""Mamba's selective scan (tegula.kernels.scan) in the emulator against the reference loop
(Mamba's `selective_scan_ref` in numpy, float64), every element: sequences spanning
several chunks with a ragged last one (the state carried across chunks), one step,
channel counts that do not divide the block, every optional input (D, z, delta_bias,
softplus), NaN propagation, f16 and bf16 inputs, dstate 1/4/7/16, the prefetching loop;
then the argument errors of both entry points."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16
from tegula.emulate.values import round_to
from tegula.kernels.scan import (selective_scan, selective_scan_emulated,
                                 selective_scan_reference)


def inputs(batch, dim, length, dstate, dtype=np.float32, seed=0):
    """Mamba-like data: delta in (0.01, 0.3) and some 25s, A negative (decays), the rest
    normal."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((batch, dim, length)).astype(dtype)
    delta = rng.uniform(0.01, 0.3, (batch, dim, length))
    delta[:, :, ::17] = 25.0       # past softplus's threshold (20): there it is the identity
    delta = delta.astype(dtype)
    A = (-np.exp(rng.standard_normal((dim, dstate))) * 0.5).astype(np.float32)
    B = rng.standard_normal((batch, dstate, length)).astype(dtype)
    C = rng.standard_normal((batch, dstate, length)).astype(dtype)
    D = rng.standard_normal(dim).astype(np.float32)
    z = rng.standard_normal((batch, dim, length)).astype(dtype)
    bias = rng.uniform(-0.005, 0.5, dim).astype(np.float32)   # keeps delta + bias > 0
    return u, delta, A, B, C, D, z, bias


def assert_close(out, want, rtol):
    """Every element within rtol of the output's scale (f32 math against float64)."""
    scale = np.abs(want).max()
    err = np.abs(out.astype(np.float64) - want)
    assert np.all(np.isfinite(out)), "unwritten or non-finite elements"
    assert err.max() <= rtol * scale, (err.max(), scale, np.unravel_index(err.argmax(), err.shape))


@pytest.mark.parametrize("batch,dim,length,dstate", [
    (2, 12, 300, 16),    # 3 chunks of 128 (last ragged); 12 channels over blocks of 8
    (1, 8, 256, 16),     # exactly two chunks (f32: 128 steps), one block
    (1, 5, 40, 4),       # a small dstate; 5 of the block's 8 channels used
    (1, 3, 9, 7),        # dstate 7 (not a power of two)
    (2, 3, 20, 1),       # dstate 1
    (1, 6, 1, 16),       # one step
])
@pytest.mark.parametrize("split", [None, False], ids=["default", "lane"])
def test_all_options_equal_reference(batch, dim, length, dstate, split):
    """The default kernel (the split-state one) and the lane-scan kernel."""
    u, delta, A, B, C, D, z, bias = inputs(batch, dim, length, dstate)
    kernel = {} if split is None else dict(SPLIT=split)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, delta_softplus=True, **kernel)
    want = selective_scan_reference(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    assert out.shape == u.shape and out.dtype == np.float32
    assert_close(out, want, 1e-5)


@pytest.mark.parametrize("options", [
    dict(),
    dict(D=True),
    dict(z=True),
    dict(delta_bias=True),
    dict(delta_bias=True, delta_softplus=True),
])
def test_each_option_alone(options):
    u, delta, A, B, C, D, z, bias = inputs(1, 9, 50, 16, seed=3)
    given = dict(D=D if options.get("D") else None, z=z if options.get("z") else None,
                 delta_bias=bias if options.get("delta_bias") else None,
                 delta_softplus=options.get("delta_softplus", False))
    out = selective_scan_emulated(u, delta, A, B, C, **given)
    assert_close(out, selective_scan_reference(u, delta, A, B, C, **given), 1e-5)


@pytest.mark.parametrize("tiles", [dict(BL=32, SPLIT=False), dict(BL=32, PREFETCH=True),
                                   dict(BD=4, BL=64, SPLIT=False),
                                   dict(BD=16, BL=16, PREFETCH=True),
                                   dict(BL=32, GROUP=2, BC_AHEAD=True), dict(BL=32, GROUP=3),
                                   dict(BL=32, GROUP=3, STATE_SMEM=False),
                                   dict(BL=16, GROUP=16, BC_AHEAD=True),
                                   dict(BL=32, STATE_LOOP=True),
                                   dict(BD=4, BL=64, STATE_LOOP=True, PREFETCH=True),
                                   dict(BL=32, STATE_SMEM=True, GROUP=2, BC_PIPE=False),
                                   dict(BL=16, STATE_SMEM=True, GROUP=3, BC_PIPE=False),
                                   dict(BD=4, BL=64, STATE_SMEM=True, PREFETCH=True),
                                   dict(BL=32, STATE_SMEM=True, GROUP=2, BC_PIPE=True),
                                   dict(BD=16, BL=16, STATE_SMEM=True, GROUP=3, BC_PIPE=True)])
def test_small_chunks_carry_the_state(tiles):
    """The lane-scan kernel's small chunks (BL 16-64: 1-4 steps per thread): many chunks, so a state dropped or
    carried wrongly between them shows; with u and delta prefetched a chunk ahead, several
    states per scan (3 does not divide 16), B/C rows loaded a group ahead, and the states
    in a run-time loop (carried in registers, or in shared memory: STATE_SMEM, whose
    groups of 3 leave one state after the loop; with BC_PIPE its B/C rows come through
    a shared ring a group ahead)."""
    u, delta, A, B, C, D, z, bias = inputs(1, 10, 79, 16, seed=5)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, True, **tiles)
    assert_close(out, selective_scan_reference(u, delta, A, B, C, D, z, bias, True), 1e-5)


@pytest.mark.parametrize("where", ["u", "delta", "B"])
def test_nan_propagates_along_the_sequence_only(where):
    """A NaN at step t poisons the state from t on: out is NaN from t to the end of that
    channel (every channel of the batch for B, which all channels read) and nowhere else."""
    u, delta, A, B, C, D, z, bias = inputs(2, 10, 300, 16, seed=13)
    given = dict(u=u, delta=delta, B=B)
    given[where] = given[where].copy()
    given[where][1, 3, 270] = np.nan          # step 270: in the second chunk
    out = selective_scan_emulated(given["u"], given["delta"], A, given["B"], C, D, z, bias,
                                  True)
    want = selective_scan_reference(given["u"], given["delta"], A, given["B"], C, D, z, bias,
                                    True)
    expect_nan = np.zeros(out.shape, bool)
    expect_nan[1, slice(None) if where == "B" else 3, 270:] = True
    np.testing.assert_array_equal(np.isnan(out), expect_nan)
    np.testing.assert_array_equal(np.isnan(want), expect_nan)
    ok = ~expect_nan
    assert np.abs(out[ok] - want[ok]).max() <= 1e-5 * np.abs(want[ok]).max()


def test_f16_inputs():
    u, delta, A, B, C, D, z, bias = inputs(1, 8, 40, 16, dtype=np.float16, seed=7)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, True)
    assert out.dtype == np.float16
    want = selective_scan_reference(u, delta, A, B, C, D, z, bias, True)
    # The result is rounded once to f16 (half an ulp: ~5e-4 relative) from f32 math.
    assert_close(out, want, 2e-3)


def test_bf16_inputs_in_float32_arrays():
    u, delta, A, B, C, D, z, bias = (round_to(x, bf16) if x.ndim == 3 else x
                                     for x in inputs(1, 8, 40, 16, seed=9))
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, True, dtype=bf16)
    np.testing.assert_array_equal(out, round_to(out, bf16))   # outputs are bf16 values
    assert_close(out, selective_scan_reference(u, delta, A, B, C, D, z, bias, True), 1e-2)


def test_f32_B_and_C_with_f16_u():
    u, delta, A, B, C, D, z, bias = inputs(1, 8, 33, 16, seed=11)
    u16, delta16 = u.astype(np.float16), delta.astype(np.float16)
    out = selective_scan_emulated(u16, delta16, A, B, C, D)
    assert_close(out, selective_scan_reference(u16, delta16, A, B, C, D), 2e-3)


@pytest.mark.parametrize("change,fragment", [
    (lambda a: a.update(B=a["B"][:, :, :-1]), "B must have shape (1, 16, 20)"),
    (lambda a: a.update(A=a["A"][:, :8]), "B must have shape (1, 8, 20)"),
    (lambda a: a.update(B=a["B"][0, :, :]), "B must be 3-D"),
    (lambda a: a.update(D=a["D"][:3]), "D must have shape (4,)"),
    (lambda a: a.update(z=a["z"].astype(np.float16)), "z must have dtype float32"),
    (lambda a: a.update(u=a["u"].tolist()), "u must be a numpy array"),
])
def test_emulated_argument_errors(change, fragment):
    u, delta, A, B, C, D, z, bias = inputs(1, 4, 20, 16)
    args = dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=bias)
    change(args)
    with pytest.raises((ValueError, TypeError)) as info:
        selective_scan_emulated(**args)
    assert "selective_scan_emulated" in str(info.value) and fragment in str(info.value), \
        str(info.value)


def test_torch_entry_checks_before_launching():
    torch = pytest.importorskip("torch")
    u, delta, A, B, C, D, z, bias = (torch.from_numpy(x) for x in inputs(1, 4, 20, 16))
    with pytest.raises(ValueError, match="selective_scan: C must have shape"):
        selective_scan(u, delta, A, B, C[:, :, :5])
    with pytest.raises(TypeError, match="selective_scan: u has dtype torch.int32"):
        selective_scan(u.int(), delta, A, B, C)
    with pytest.raises(ValueError, match="selective_scan: u is on cpu"):
        selective_scan(u, delta, A, B, C, D, z, bias, True)


def test_contradicting_state_schemes_are_refused():
    """Options the chosen state scheme would ignore are an error, not silently dropped."""
    u, delta, A, B, C, D, z, bias = inputs(1, 4, 10, 4)
    with pytest.raises(ValueError, match="STATE_SMEM .* does not combine with STATE_LOOP"):
        selective_scan_emulated(u, delta, A, B, C, STATE_SMEM=True, STATE_LOOP=True)
    with pytest.raises(ValueError, match="BC_PIPE .* needs STATE_SMEM=True"):
        selective_scan_emulated(u, delta, A, B, C, STATE_SMEM=False, BC_PIPE=True)


@pytest.mark.parametrize("dtype,tiles", [("f32", {}), ("bf16", {}),
                                         ("f32", dict(BL=256, STATE_LOOP=True)),
                                         ("f32", dict(STATE_SMEM=False))])
def test_cuda_compiles_for_sm90a(dtype, tiles):
    """The default kernels, the state loop and the unrolled states compile to a cubin (no
    GPU needed)."""
    from tegula.build import build
    from tegula.dtypes import f32
    from tegula.kernels.scan import (_merged_tiles, selective_scan_config,
                                     selective_scan_kernel)
    from tegula.runtime.compiler import available_compilers, compile_cuda
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    dt = f32 if dtype == "f32" else bf16
    constexprs = dict(_merged_tiles("test", selective_scan_config(1536, 16, dtype=dt), tiles),
                      HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True)
    source = build(selective_scan_kernel(dt, dt), constexprs, target="sm_90a").cuda_source()
    assert compile_cuda(source, "selective_scan_fwd", "sm_90a")[:4] == b"\x7fELF"
