"""tegula.build: the one compile path, tg.emulate, and argument binding."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32, i8
from tegula.build import build, normalize_grid, split_arguments
from tegula.emulate import EmulationError
from tegula.errors import LaunchError, SynthesisError


@tg.kernel(threads=64)
def scale(x: tg.Tensor[f32], y: tg.Tensor[f32], factor: int, BM: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, 32), (m, 0))) * 2.0, y.tile((BM, 32), (m, 0)))


def test_emulate_is_exported_and_runs_a_kernel_on_numpy_arrays():
    x = np.random.default_rng(5).standard_normal((37, 32)).astype(np.float32)
    y = np.full_like(x, np.nan)
    report = tg.emulate(scale, (3,), x, y, 7)
    assert np.array_equal(y, x * 2)
    assert "GlobalStore" in str(report)


def test_builds_are_cached_per_constexprs_and_threads():
    assert build(scale, {"BM": 16}) is build(scale, {"BM": 16})
    assert build(scale, {"BM": 16}) is not build(scale, {"BM": 8})
    assert build(scale, {"BM": 16, "threads": 128}).thread_kernel.threads == 128


def test_arguments_bind_positionally_and_by_name():
    tensors, scalars, constexprs = split_arguments(scale, ("X", "Y"), {"factor": 3, "BM": 8})
    assert tensors == {"x": "X", "y": "Y"} and scalars == {"factor": 3}
    assert constexprs == {"BM": 8}


@pytest.mark.parametrize("args,kwargs,message", [
    (("X", "Y", 1, 2), {}, "takes 3 run-time arguments"),
    (("X",), {}, "missing argument"),
    (("X", "Y", 1), {"nope": 1}, "no parameter 'nope'"),
    (("X", "Y"), {"x": 1, "factor": 2}, "given twice"),
])
def test_bad_arguments_are_launch_errors(args, kwargs, message):
    with pytest.raises(LaunchError, match=message):
        split_arguments(scale, args, kwargs)


def test_emulate_checks_ranks():
    with pytest.raises(LaunchError, match="rank 1"):
        tg.emulate(scale, (1,), np.zeros(4, np.float32), np.zeros((4, 32), np.float32), 1)


@pytest.mark.parametrize("grid,expected", [(3, (3, 1, 1)), ((2, 5), (2, 5, 1)),
                                           (np.array([3, 2]), (3, 2, 1)),
                                           ((1, 2, 3), (1, 2, 3)), ([4, np.int64(2)], (4, 2, 1)),
                                           (0, (0, 1, 1)), ((2, 0), (2, 0, 1))])
def test_grids_normalize_to_three_extents(grid, expected):
    assert normalize_grid(grid) == expected  # a zero extent: an empty grid, no blocks


@pytest.mark.parametrize("grid,message", [
    ((1, 70000), "exceeds CUDA's limits"), ("x", "tuple of up to three ints"),
    (2.0, "tuple of up to three ints"), ((37 / 16, 2), "tuple of up to three ints"),
    (np.float32(3), "tuple of up to three ints"), ((True, 1), "tuple of up to three ints"),
    (np.array([2.0, 1.0]), "tuple of up to three ints"),
    (None, "tuple of up to three ints"), ((1, -1), "non-negative"), ((), "one to three"),
    ((1, 2, 3, 4), "one to three")])
def test_bad_grids_are_launch_errors(grid, message):
    with pytest.raises(LaunchError, match=message):
        normalize_grid(grid)


def test_a_float_grid_is_refused_at_launch_before_compiling():
    torch = pytest.importorskip("torch")
    x, y = torch.ones((37, 32)), torch.ones((37, 32))
    with pytest.raises(LaunchError, match=r"got \(2.3125,\)"):
        scale[(37 / 16,)](x, y, 1)
    with pytest.raises(LaunchError, match="got 2.0"):
        tg.emulate(scale, 2.0, x.numpy(), y.numpy(), 1)


# --------------------------------------------------------------------------------------
# Empty inputs, and outputs no block wrote
# --------------------------------------------------------------------------------------

def test_an_empty_grid_on_empty_tensors_runs_no_block():
    x, y = np.zeros((0, 32), np.float32), np.zeros((0, 32), np.float32)
    assert tg.emulate(scale, (tg.cdiv(0, 16),), x, y, 1).blocks == 0


def test_a_grid_too_small_for_the_output_is_an_error():
    x = np.random.default_rng(1).standard_normal((37, 32)).astype(np.float32)
    y = np.zeros_like(x)
    with pytest.raises(EmulationError) as info:
        tg.emulate(scale, (2,), x, y, 1)          # 2 blocks of 16 rows: rows 32..36 unwritten
    message = str(info.value)
    assert "output 'y' (shape (37, 32)): 160 of 1184 elements written by no block" in message
    assert "(32, 0), (32, 1)" in message and "check_coverage=False" in message
    assert np.array_equal(y[:32], x[:32] * 2) and np.isnan(y[32:]).all()  # poisoned


def test_coverage_can_be_turned_off_for_kernels_that_write_a_subset():
    x = np.random.default_rng(2).standard_normal((37, 32)).astype(np.float32)
    y = np.full_like(x, -1.0)
    tg.emulate(scale, (2,), x, y, 1, check_coverage=False)
    assert np.array_equal(y[:32], x[:32] * 2) and (y[32:] == -1.0).all()  # not poisoned
    with pytest.raises(EmulationError, match="'y'"):
        tg.emulate(scale, (2,), x, y, 1, check_coverage=["y"])
    with pytest.raises(LaunchError, match="never writes"):
        tg.emulate(scale, (3,), x, y, 1, check_coverage=["x"])


def test_an_output_sharing_memory_with_an_input_is_not_poisoned():
    x = np.random.default_rng(8).standard_normal((37, 32)).astype(np.float32)
    before = x.copy()
    tg.emulate(scale, (3,), x, x, 1)              # in place: y is x
    assert np.array_equal(x, before * 2)
    with pytest.raises(EmulationError, match="'y'"):
        tg.emulate(scale, (2,), x, x, 1)          # still checked, but x's rows 32.. intact
    assert np.array_equal(x[32:], before[32:] * 2)


def test_written_nans_count_as_written():
    x = np.random.default_rng(3).standard_normal((37, 32)).astype(np.float32)
    x[::3, ::5] = np.nan
    y = np.zeros_like(x)
    tg.emulate(scale, (3,), x, y, 1)
    assert np.array_equal(y, x * 2, equal_nan=True)


@tg.kernel(threads=32)
def accumulate(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    m = tg.block_id(0)
    tile = y.tile((8, 16), (m, 0))
    tg.copy(tg.load(tile) + tg.load(x.tile((8, 16), (m, 0))), tile)


@tg.kernel(threads=32)
def add_into(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    m = tg.block_id(0)
    tg.atomic_add(tg.load(x.tile((8, 16), (m, 0))), y.tile((8, 16), (m, 0)))


@pytest.mark.parametrize("kernel", [accumulate, add_into])
def test_read_modify_write_outputs_are_checked_but_never_poisoned(kernel):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((20, 16)).astype(np.float32)
    y = rng.standard_normal((20, 16)).astype(np.float32)
    before = y.copy()
    with pytest.raises(EmulationError, match=r"'y' \(shape \(20, 16\)\): 64 of 320"):
        tg.emulate(kernel, (2,), x, y)            # rows 16..19 unwritten
    assert np.array_equal(y[16:], before[16:])    # the input part is intact
    np.testing.assert_allclose(y[:16], before[:16] + x[:16], rtol=1e-6)


@tg.kernel(threads=64)
def copy_i8(x: tg.Tensor[i8], y: tg.Tensor[i8]):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((16, 32), (m, 0))), y.tile((16, 32), (m, 0)))


def test_an_integer_output_equal_to_the_poison_counts_as_written():
    x = np.full((20, 32), -91, np.int8)          # 0xA5: the poison byte itself
    x[::2] = np.random.default_rng(5).integers(-128, 128, (10, 32), dtype=np.int8)
    y = np.zeros_like(x)
    tg.emulate(copy_i8, (2,), x, y)
    assert np.array_equal(y, x)


# --------------------------------------------------------------------------------------
# Extents the kernel assumes equal: a gemm's K, tensors combined at the same coordinates
# --------------------------------------------------------------------------------------

def _assumed(kernel, **constexprs):
    from tegula.ir.extents import assumptions
    return sorted((a.what, a.a, a.b) for a in assumptions(kernel.trace(**constexprs)))


def test_the_library_kernels_assume_what_their_entry_points_check():
    from tegula.kernels.elementwise import silu_mul_kernel
    from tegula.kernels.gemm import gemm_kernel, gemm_registers_kernel, gemm_split_k_kernel
    from tegula.kernels.norm import rms_norm_kernel, rms_norm_looped_kernel
    from tegula.kernels.softmax import softmax_kernel
    for kernel in (gemm_kernel(f16), gemm_registers_kernel(f16), gemm_split_k_kernel(f16)):
        assert _assumed(kernel) == [("tg.gemm", ("a", 1), ("b", 1))]
    assert ("tg.mul", ("x", 1), ("y", 1)) in _assumed(silu_mul_kernel(f32))
    assert ("tg.mul", ("x", 0), ("y", 0)) in _assumed(silu_mul_kernel(f32))
    for kernel in (rms_norm_kernel(f32), rms_norm_looped_kernel(f32)):
        assert _assumed(kernel, N=64) == [("tg.mul", ("w", 1), ("x", 1))]  # w is (1, N)
    assert _assumed(softmax_kernel(f32)) == [] and _assumed(scale) == []


GEMM_MISMATCH = (r"tg.gemm contracts a's dim 1 \(extent 96\) with b's dim 1 \(extent 64\), "
                 r"which must be equal: a has shape \(64, 96\), b has shape \(64, 64\)")


@pytest.mark.parametrize("shared", [True, False])
def test_a_k_that_differs_between_a_and_b_is_a_launch_error(shared):
    from tegula.kernels.gemm import gemm_kernel, gemm_registers_kernel
    kernel = gemm_kernel(f16) if shared else gemm_registers_kernel(f16)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((64, 96)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float16)
    with pytest.raises(LaunchError, match=GEMM_MISMATCH) as info:
        tg.emulate(kernel, (1, 1), a, b, c, BM=64, BN=64, BK=32)
    assert "tg.gemm" in info.value.loc.line
    torch = pytest.importorskip("torch")
    with pytest.raises(LaunchError, match=GEMM_MISMATCH):  # before compiling (no GPU here)
        kernel[(1, 1)](torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c),
                       BM=64, BN=64, BK=32)
    tg.emulate(kernel, (1, 1), a[:, :64], b, c, BM=64, BN=64, BK=32)  # a view of the part
    np.testing.assert_allclose(c, (a[:, :64].astype(np.float32) @ b.T.astype(np.float32)),
                               rtol=2e-3, atol=2e-2)


@tg.kernel(threads=64)
def add(x: tg.Tensor[f32], y: tg.Tensor[f32], bias: tg.Tensor[f32], out: tg.Tensor[f32]):
    m, n = tg.block_id(0), tg.block_id(1)
    total = tg.load(x.tile((8, 32), (m, n))) + tg.load(y.tile((8, 32), (m, n)))
    tg.copy(total + tg.load(bias.tile((1, 32), (0, n))), out.tile((8, 32), (m, n)))


@pytest.mark.parametrize("y_shape,bias_shape,message", [
    ((20, 40), (1, 50), r"tg.add combines element by element bias's dim 1 \(extent 50\) with "
                        r"x's dim 1 \(extent 40\)"),
    ((20, 39), (1, 40), r"x's dim 1 \(extent 40\) with y's dim 1 \(extent 39\)"),
    ((21, 40), (1, 40), r"x's dim 0 \(extent 20\) with y's dim 0 \(extent 21\)"),
])
def test_tensors_combined_at_the_same_coordinates_must_agree(y_shape, bias_shape, message):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((20, 40)).astype(np.float32)
    y = rng.standard_normal(y_shape).astype(np.float32)
    bias = rng.standard_normal(bias_shape).astype(np.float32)
    out = np.zeros((20, 40), np.float32)
    with pytest.raises(LaunchError, match=message):
        tg.emulate(add, (3, 2), x, y, bias, out)
    y, bias = y[:20, :40], bias[:, :40]            # views of the parts meant
    if y.shape == (20, 40) and bias.shape == (1, 40):
        tg.emulate(add, (3, 2), x, y, bias, out)
        assert np.array_equal(out, x + y + bias)


def test_coverage_counts_packed_elements():
    from tegula.dtypes import i4
    from tegula.kernels.copy import copy_kernel
    x = np.random.default_rng(9).integers(0, 256, (20, 16), dtype=np.uint8)  # 20 x 32 nibbles
    y = np.zeros_like(x)
    with pytest.raises(EmulationError, match=r"'y' \(shape \(20, 32\)\): 128 of 640"):
        tg.emulate(copy_kernel(i4), (1, 1), x, y, BM=16, BN=32)
    tg.emulate(copy_kernel(i4), (1, 2), x, y, BM=16, BN=32)
    assert np.array_equal(y, x)


@pytest.mark.parametrize("factor", [2.7, True, "2", None])
def test_scalars_are_checked_as_a_launch_checks_them(factor):
    x, y = np.ones((16, 32), np.float32), np.zeros((16, 32), np.float32)
    with pytest.raises(LaunchError, match="argument 'factor' must be an int"):
        tg.emulate(scale, (1,), x, y, factor)
    assert (y == 0).all()  # refused before the output was poisoned
    tg.emulate(scale, (1,), x, y, np.int64(3))    # numpy integers are ints


# --------------------------------------------------------------------------------------
# blocks_per_sm: __launch_bounds__(threads, B), registers capped at B blocks' share
# --------------------------------------------------------------------------------------

def _scan_build(**options):
    """The selective scan with its 16 states unrolled (session 7's scheme, register-heavy:
    the default since session 9 keeps the states in a loop and needs far fewer)."""
    from tegula.kernels.scan import (_UNROLLED_TILES, selective_scan_config,
                                     selective_scan_kernel)

    cfg = selective_scan_config(64, 16, dtype=f32)
    cfg.update(_UNROLLED_TILES["f32"], STATE_SMEM=False, BC_PIPE=False)
    cfg.update(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True, **options)
    return build(selective_scan_kernel(f32, f32), cfg)


def test_blocks_per_sm_caps_registers_in_the_compiled_kernel():
    """The selective scan takes ~180 registers a thread on its own; at 3 blocks of 128 per
    SM ptxas must hold it to 168 (65536 / 384, in units of 8)."""
    from tegula.explain import compile_report

    free = _scan_build(blocks_per_sm=None)
    capped = _scan_build(blocks_per_sm=3)
    assert "__launch_bounds__(128, 3)" in capped.cuda_source()
    assert "__launch_bounds__(128)\n" in free.cuda_source()
    assert compile_report(free).registers > 168          # so the cap below is the option's
    assert compile_report(capped).registers <= 168
    assert "at 3 blocks per SM (blocks_per_sm)" in capped.explain()


def test_blocks_per_sm_is_what_the_cost_model_counts_as_occupancy():
    from tegula.synth.cost import estimate

    assert estimate(_scan_build(blocks_per_sm=3), grid=(4, 192)).blocks_per_sm == 3


def test_blocks_per_sm_does_not_change_what_a_kernel_computes():
    x = np.random.default_rng(6).standard_normal((37, 32)).astype(np.float32)
    y = np.full_like(x, np.nan)
    tg.emulate(scale, (3,), x, y, 7, blocks_per_sm=4)
    assert np.array_equal(y, x * 2)


@pytest.mark.parametrize("blocks,message", [
    (0, "must be None or a positive int"), (True, "must be None or a positive int"),
    (2.0, "must be None or a positive int"), (33, "do not fit an SM"),
])
def test_blocks_per_sm_refuses_values_an_sm_cannot_hold(blocks, message):
    with pytest.raises(tg.TegulaError, match=message):
        build(scale, {"BM": 16, "threads": 64, "blocks_per_sm": blocks})
    with pytest.raises(tg.TegulaError, match="do not fit an SM"):
        build(scale, {"BM": 16, "threads": 1024, "blocks_per_sm": 3})


def test_blocks_per_sm_is_refused_where_warp_roles_set_register_budgets():
    from tegula.kernels.gemm import gemm_kernel

    # Warp roles forced: this shape alone would run in one role by the cost model's choice.
    constexprs = dict(BM=128, BN=128, BK=64, STAGES=3, threads=256, warp_specialize=True)
    specialized = build(gemm_kernel(f16), constexprs)
    assert "setmaxnreg" in specialized.cuda_source()
    with pytest.raises(SynthesisError, match="setmaxnreg"):
        build(gemm_kernel(f16), dict(constexprs, blocks_per_sm=2))
