"""Every instruction of the catalogue, checked on the GPU.

Each micro-kernel (`tests/gpu/hwcheck.py`) maps registers to memory by the catalogue's own
TV layouts, so a wrong entry computes the wrong thing here. Thread-IR micro-kernels also
run on the emulator, which must agree with the GPU bit for bit; raw kernels print the
catalogue's PTX templates (`format_asm`) themselves. Inputs are random (never zeros);
outputs are poisoned first.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tegula.arch import MMA_INSTRUCTIONS, catalogue, get_mma, get_target
from tegula.dtypes import dtype_from_name, f16, i32
from tegula.emulate import round_to, run_thread_kernel
from tegula.emulate.exprs import compile_expr
from tegula.kernels.common import random_input
from tegula.lower.thread_ir import TID

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
import hwcheck as hw  # noqa: E402  (test support beside this file)
from gpu_helpers import (bits_of, device_cc, launch, launch_raw, poison,  # noqa: E402
                         storage_bits, to_device, torch_dtype)

MMA_NAMES = [i.name for i in MMA_INSTRUCTIONS]


@pytest.fixture
def rng(request):
    """Random data per test, different for every test (seeded by the test id, so a
    failure reproduces)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _need_mma(name: str) -> None:
    if device_cc() < get_mma(name).min_cc:
        pytest.skip(f"{name} needs sm_{get_mma(name).min_cc}")


def _mma_inputs(rng, name: str, kind: str):
    """A (M,K), B (N,K), C (M,N) storage values. kind "exact": small integers, so every
    sum is exact in the accumulator type (the result must match to the bit); "random":
    normal values (integer types: their whole range)."""
    instr = get_mma(name)
    m, n, k = instr.shape_mnk
    out = []
    for dt, shape in ((instr.a_dtype, (m, k)), (instr.b_dtype, (n, k)), (instr.c_dtype, (m, n))):
        if kind == "exact" and dt.is_float:
            out.append(round_to(rng.integers(-3, 4, size=shape).astype(np.float32), dt))
        else:
            out.append(random_input(rng, shape, dt))
    return out


def _mma_tolerance(name: str) -> float:
    """Error bound relative to sum |a||b| + |c| for random float data: f32 accumulation of
    exact products (a few f32 ulps); f16 accumulation (rounded to f16); f8 operands
    (Hopper's f8 tensor cores accumulate with fewer bits than f32)."""
    instr = get_mma(name)
    if instr.c_dtype.name == "f16":
        return 2.0 ** -9
    if instr.a_dtype.bits == 8:
        return 2.0 ** -10
    return 2.0 ** -18


def _check_mma(name: str, kind: str, a, b, c, d_bits: np.ndarray) -> None:
    instr = get_mma(name)
    ref = hw.mma_reference(name, a, b, c)
    if kind == "exact" or not instr.c_dtype.is_float:
        want = storage_bits(round_to(ref, instr.c_dtype), instr.c_dtype)
        assert np.array_equal(d_bits, want), f"{name}: D differs from a @ b.T + c"
        return
    from tegula.emulate.values import from_bits
    d = from_bits(d_bits, instr.c_dtype).astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T + np.abs(c)
    err = np.abs(d - ref)
    bound = _mma_tolerance(name) * scale
    assert np.all(err <= bound), f"{name}: max error {err.max()}, bound {bound.min()}"


@pytest.mark.parametrize("kind", ["exact", "random"])
@pytest.mark.parametrize("name", MMA_NAMES)
def test_mma_fragments_by_catalogue_layouts_match_matmul(rng, name, kind):
    _need_mma(name)
    instr = get_mma(name)
    a, b, c = _mma_inputs(rng, name, kind)
    ta, tb, tc = (to_device(x, dt) for x, dt in ((a, instr.a_dtype), (b, instr.b_dtype),
                                                  (c, instr.c_dtype)))
    td = poison(torch.empty(tc.shape, dtype=tc.dtype, device="cuda"))
    kernel = hw.mma_kernel(name)
    launch(kernel, 1, ta, tb, tc, td)
    got = bits_of(td, instr.c_dtype)
    _check_mma(name, kind, a, b, c, got)
    if kind == "exact" or not instr.c_dtype.is_float:  # exact data: the emulator agrees
        d_emu = np.zeros_like(c)
        run_thread_kernel(kernel, 1, dict(a=a, b=b, c=c, d=d_emu))
        assert np.array_equal(storage_bits(d_emu, instr.c_dtype), got)


@pytest.mark.parametrize("kind", ["exact", "random"])
@pytest.mark.parametrize("name", MMA_NAMES)
def test_mma_ptx_template_with_host_packed_fragments(rng, name, kind):
    _need_mma(name)
    instr = get_mma(name)
    a, b, c = _mma_inputs(rng, name, kind)
    words = [hw.fragments(instr, op, storage_bits(x, dt))
             for op, x, dt in (("a", a, instr.a_dtype), ("b", b, instr.b_dtype),
                               ("c", c, instr.c_dtype))]
    ta, tb, tc = (to_device(w.astype(np.uint32), i32) for w in words)
    td = poison(torch.empty_like(tc))
    launch_raw(hw.raw_mma_kernel(name), 1, ta, tb, tc, td)
    d_words = bits_of(td, i32).astype(np.uint32)
    _check_mma(name, kind, a, b, c, hw.unfragment(instr, d_words))


def _distinct_f16(rng, n: int) -> np.ndarray:
    """n distinct f16 values (a permutation of integers, all exact)."""
    return (rng.permutation(n) + 1).astype(np.float16)


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_registers_follow_catalogue_table(rng, num, trans):
    src = _distinct_f16(rng, 64 * num)
    out = poison(torch.empty(32, 2 * num, dtype=torch.float16, device="cuda"))
    kernel = hw.ldmatrix_kernel(num, trans)
    launch(kernel, 1, to_device(src, f16), out)
    got = bits_of(out, f16)
    want = storage_bits(hw.expected_ldmatrix(num, trans, src), f16)
    assert np.array_equal(got, want)
    emu = np.zeros((32, 2 * num), np.float16)
    run_thread_kernel(kernel, 1, dict(src=src, out=emu))
    assert np.array_equal(storage_bits(emu, f16), got)


@pytest.mark.parametrize("op", ["ldmatrix", "stmatrix"])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_matrix_ptx_template_follows_catalogue_table(rng, op, num, trans):
    if op == "stmatrix" and device_cc() < 90:
        pytest.skip("stmatrix needs sm_90")
    raw = hw.raw_matrix_kernel(op, num, trans)
    if op == "ldmatrix":
        src = _distinct_f16(rng, 64 * num)
        out = poison(torch.empty(32, num, dtype=torch.int32, device="cuda"))
        launch_raw(raw, 1, to_device(src, f16), out)
        got = bits_of(out, i32).astype(np.uint32)
        want = hw.expected_raw_matrix(op, num, trans, storage_bits(src, f16))
    else:
        lane_vals = storage_bits(_distinct_f16(rng, 64 * num), f16).reshape(32, 2 * num)
        words = hw.pack_words(lane_vals, 16)
        out = poison(torch.empty(64 * num, dtype=torch.float16, device="cuda"))
        launch_raw(raw, 1, to_device(words, i32), out)
        got = bits_of(out, f16).astype(np.uint64)
        want = hw.expected_raw_matrix(op, num, trans, words)
    assert np.array_equal(got, want)


_SHUFFLE_ARGS = {
    "xor": [1, 2, 4, 8, 16, 5, 31, 33],                # 33: the partner is out of range
    "idx": [0, 17, 31, 37, (TID * 7 + 3) % 32, (TID * 3) % 41],  # 37, 41: masked to 5 bits
    "down": [1, 3, 16, 31, TID % 4],
    "up": [1, 4, 16, 31, TID % 4],
}
_SHUFFLE_CASES = [(mode, i) for mode, args in _SHUFFLE_ARGS.items() for i in range(len(args))]


@pytest.mark.parametrize("dtype_name", hw.SHUFFLE_DTYPES)
@pytest.mark.parametrize("mode,which", _SHUFFLE_CASES)
def test_shuffle_source_lanes_match_catalogue(rng, mode, which, dtype_name):
    dtype = dtype_from_name(dtype_name)
    arg = _SHUFFLE_ARGS[mode][which]
    kernel = hw.shuffle_kernel(mode, arg, dtype)
    x = random_input(rng, (64,), dtype, 4.0)
    out = poison(torch.empty(64, dtype=torch_dtype(dtype), device="cuda"))
    launch(kernel, 1, to_device(x, dtype), out)
    got = bits_of(out, dtype)
    args = np.broadcast_to(compile_expr(arg)({"tid": np.arange(64)})
                           if not isinstance(arg, int) else arg, (64,))
    assert np.array_equal(got, storage_bits(hw.expected_shuffle(mode, args, x), dtype))
    emu = np.zeros_like(x)
    run_thread_kernel(kernel, 1, dict(x=x, out=emu))
    assert np.array_equal(storage_bits(emu, dtype), got)


@pytest.mark.parametrize("ptx_mode,ir_mode", [("bfly", "xor"), ("idx", "idx"),
                                              ("down", "down"), ("up", "up")])
def test_shuffle_ptx_template_with_per_lane_arguments(rng, ptx_mode, ir_mode):
    x = rng.integers(-2**31, 2**31, size=64, dtype=np.int64).astype(np.int32)
    args = rng.integers(0, 40, size=64).astype(np.int32)   # some out of range
    out = poison(torch.empty(64, dtype=torch.int32, device="cuda"))
    launch_raw(hw.raw_shuffle_kernel(ptx_mode), 1, torch.from_numpy(x).cuda(),
               torch.from_numpy(args).cuda(), out)
    assert np.array_equal(out.cpu().numpy(), hw.expected_shuffle(ir_mode, args, x))


_CP_ASYNC_CASES = [("f32", 1), ("f16", 2), ("u8", 4), ("f32", 2), ("bf16", 4), ("i8", 8),
                   ("f32", 4), ("f16", 8), ("u8", 16), ("i32", 4)]


@pytest.mark.parametrize("dtype_name,count", _CP_ASYNC_CASES)
def test_cp_async_copies_and_zero_fills(rng, dtype_name, count):
    dtype = dtype_from_name(dtype_name)
    kernel = hw.cp_async_kernel(dtype, count)
    x = random_input(rng, (32 * count,), dtype, 4.0)
    tx = to_device(x, dtype)
    out = poison(torch.empty_like(tx))
    launch(kernel, 1, tx, out)
    got = bits_of(out, dtype)
    assert np.array_equal(got, storage_bits(hw.expected_cp_async(x, count), dtype))
    emu = np.zeros_like(x)
    run_thread_kernel(kernel, 1, dict(x=x, out=emu))
    assert np.array_equal(storage_bits(emu, dtype), got)


@pytest.mark.parametrize("nbytes,cache", [(4, "ca"), (8, "ca"), (16, "ca"), (16, "cg")])
def test_cp_async_ptx_template_copies_and_zero_fills(rng, nbytes, cache):
    words = nbytes // 4
    x = rng.integers(-2**31, 2**31, size=32 * words, dtype=np.int64).astype(np.int32)
    out = poison(torch.empty(32 * words, dtype=torch.int32, device="cuda"))
    launch_raw(hw.raw_cp_async_kernel(nbytes, cache), 1, torch.from_numpy(x).cuda(), out)
    assert np.array_equal(out.cpu().numpy(), hw.expected_cp_async(x, words))


@pytest.mark.parametrize("space", ["global", "shared"])
@pytest.mark.parametrize("dtype_name,count", hw.VECTOR_CASES)
def test_vector_access_widths_with_predicates(rng, dtype_name, count, space):
    dtype = dtype_from_name(dtype_name)
    kernel = hw.vector_kernel(dtype, count, space)
    x = random_input(rng, (64 * count,), dtype, 4.0)
    before = random_input(rng, (64 * count,), dtype, 4.0)  # what out holds beforehand
    tx, tout = to_device(x, dtype), to_device(before, dtype)
    launch(kernel, 1, tx, tout)
    got = bits_of(tout, dtype)
    fill = round_to(np.asarray(hw.FILL), dtype)[()]
    sentinel = round_to(np.asarray(hw.SENTINEL), dtype)[()]
    want = hw.expected_vector(space, x, before, count, fill, sentinel)
    assert np.array_equal(got, storage_bits(want, dtype))
    emu = before.copy()
    run_thread_kernel(kernel, 1, dict(x=x, out=emu))
    assert np.array_equal(storage_bits(emu, dtype), got)


def test_every_catalogue_entry_of_the_device_is_covered():
    """A new catalogue entry must get a hardware check here."""
    target = get_target(f"sm_{device_cc()}a" if device_cc() >= 90 else f"sm_{device_cc()}")
    checked_kinds = {"mma", "ld.global", "st.global", "ld.shared", "st.shared", "cp.async",
                     "ldmatrix", "stmatrix", "shfl", "cp.async.commit",
                     "red.global",  # tests/gpu/test_red_entries.py
                     "cvt",  # tests/gpu/test_cvt_entries.py
                     "half",  # tests/gpu/test_half_ops_gpu.py (every 16-bit pattern)
                     # tests/gpu/test_issue8_regressions.py::test_nan_propagates_through_max_and_min
                     "minmax",
                     "logic",  # tests/gpu/test_lop3_gpu.py (lop3.b32 chains vs the emulator)
                     # lg2.approx.f32: tests/gpu/test_lg2_entry_gpu.py (its bound on random
                     # inputs and zeros, subnormals, infinities, NaN, negatives)
                     "sfu",
                     # tg.last_arrival's atom.acq_rel.gpu.global.inc.u32 and
                     # bar.red.or.pred: tests/gpu/test_last_arrival_gpu.py (300 rows of 33
                     # blocks merged by the last, counters back at 0 after each launch)
                     "atom.inc", "bar.red",
                     # Hopper entries: tests/gpu/test_hopper_instructions.py (TMA loads of
                     # rank 2 and stores of rank 1 run; other ranks and multicast are only
                     # assembled, by tests/arch/test_tma.py)
                     "wgmma", "tma.load", "tma.store", "bulk.commit", "bulk.wait",
                     "mbarrier.init", "mbarrier.arrive", "mbarrier.arrive_tx", "mbarrier.wait",
                     "fence.proxy_async", "fence.mbarrier_init", "wgmma.fence", "wgmma.commit",
                     "wgmma.wait", "bar.named", "setmaxnreg", "elect",
                     # cluster entries: tests/gpu/test_cluster_gemm_gpu.py runs them in the
                     # 2-CTA GEMM (remote releases of every stage, the cluster barriers after
                     # init and before exit) against torch, and under racecheck/synccheck
                     "mbarrier.arrive_remote", "cluster.arrive", "cluster.wait",
                     # TMA reduce-adds of rank 4 and 3: tests/gpu/test_bulk_add_gpu.py
                     # (several blocks adding into non-zero values, against numpy and the
                     # emulator bit for bit); other ranks only assembled (tests/arch)
                     "tma.reduce",
                     # prefetch.tensormap (a hint): every TMA kernel issues it at its start;
                     # tests/gpu/test_matmul_persistent_gpu.py runs those into poisoned outputs
                     "tma.prefetch"}
    vector_bytes = {dtype_from_name(d).bits * c // 8 for d, c in hw.VECTOR_CASES}
    for instr in catalogue(target):
        assert instr.kind in checked_kinds, instr.name
        if instr.kind == "mma":
            assert instr.name in MMA_NAMES
        if instr.kind.startswith(("ld.", "st.")):
            assert instr.nbytes in vector_bytes, instr.name
