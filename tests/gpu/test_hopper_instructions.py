"""The Hopper catalogue entries (`tegula.arch.wgmma`, `tegula.arch.tma`) on hardware, through
their own `format_asm` text (builders: `tests/gpu/hwcheck_hopper.py`).

* wgmma m64n{8,64,128,256} f16 and bf16 (and f16-accumulating, fp8, A-from-register and
  MN-major forms) from a hand-filled buffer in every swizzle mode, against the entry's `execute`
  (bit-exact on small integers, within f32 rounding on random data) — so the fragments,
  the descriptor encoding and the swizzle model are all checked;
* a 2-D TMA load with out-of-bounds zero fill in every swizzle mode, landing exactly where
  `tma_box_addresses` says;
* mbarrier phase parity across two phases; named barriers, elect.sync, setmaxnreg and a
  TMA store with bulk-group waits.
Inputs are random (never zeros); outputs are poisoned first. Needs sm_90a.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.wgmma import get_wgmma
from tegula.dtypes import bf16, f16, f32, i32
from tegula.emulate import round_to
from tegula.kernels.common import random_input

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers beside us
import hwcheck_hopper as hh  # noqa: E402
from gpu_helpers import bits_of, device_cc, launch_raw, poison, storage_bits, to_device  # noqa: E402

SWIZZLES = (0, 32, 64, 128)
WGMMA_SS = [f"wgmma.m64n{n}k16.f32.{t}.{t}" for t in ("f16", "bf16") for n in (8, 64, 128, 256)]
WGMMA_MORE = ["wgmma.m64n64k16.f16.f16.f16", "wgmma.m64n136k16.f32.f16.f16",
              "wgmma.m64n64k32.f32.e4m3.e4m3", "wgmma.m64n32k32.f32.e5m2.e4m3"]


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _need_sm90a():
    if device_cc() < 90:
        pytest.skip("Hopper instructions need sm_90a")


def _inputs(rng, instr, swizzle: int, kind: str, mn_major: bool = False):
    """A (64, K), B (N, K), C (64, N) values: small integers ("exact": every sum exact in the
    accumulator) or normal random values, in the operand / accumulator types."""
    k = hh.wgmma_k_total(instr, swizzle, mn_major)
    out = []
    for dt, shape in ((instr.a_dtype, (64, k)), (instr.b_dtype, (instr.n, k)),
                      (instr.acc_dtype, (64, instr.n))):
        if kind == "exact":
            out.append(round_to(rng.integers(-3, 4, size=shape).astype(np.float32), dt))
        else:
            out.append(random_input(rng, shape, dt))
    return out


def _run_wgmma(rng, name: str, swizzle: int, kind: str, scale: int, regs: bool,
               mn_major: bool = False):
    instr = get_wgmma(name)
    a, b, c = _inputs(rng, instr, swizzle, kind, mn_major)
    a_bits, b_bits = storage_bits(a, instr.a_dtype), storage_bits(b, instr.b_dtype)
    image = hh.wgmma_image(instr, swizzle, a_bits, b_bits, mn_major)
    frag = hh.a_fragment_words(instr, a_bits) if regs else np.zeros((128, 4), np.uint32)
    c_words = hh.acc_words(instr, storage_bits(c, instr.acc_dtype).astype(np.uint64))
    timg, tfrag, tc = (to_device(x.astype(np.uint32).view(np.int32), i32)
                       for x in (image.view(np.uint32), frag, c_words))
    tout = poison(torch.empty_like(tc))
    launch_raw(hh.raw_wgmma_kernel(name, swizzle, regs, mn_major), 1, timg, tfrag, tc, tout,
               scale)
    got_bits = hh.acc_matrix(instr, bits_of(tout, i32).astype(np.uint32))
    want = hh.expected_wgmma(instr, a, b, c, scale)
    ref = (torch.from_numpy(a.astype(np.float64)) @ torch.from_numpy(b.astype(np.float64)).T
           + scale * torch.from_numpy(c.astype(np.float64))).numpy()
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T + scale * np.abs(c)
    ulp = 2.0 ** -7 if instr.acc_dtype != f32 else 2.0 ** -20  # rounding once per k-step
    assert np.all(np.abs(want - ref) <= ulp * bound), "the entry's execute disagrees with torch"
    if kind == "exact":
        assert np.array_equal(got_bits, storage_bits(want, instr.acc_dtype).astype(np.uint64)), \
            f"{name} swizzle {swizzle}: D differs from A·Bᵀ + C"
        return
    from tegula.emulate.values import from_bits
    got = from_bits(got_bits.astype(np.uint32 if instr.acc_dtype == f32 else np.uint16),
                    instr.acc_dtype).astype(np.float64)
    tol = 2.0 ** -9 if instr.acc_dtype != f32 else (2.0 ** -10 if instr.a_dtype.bits == 8
                                                     else 2.0 ** -18)
    err = np.abs(got - want.astype(np.float64))
    assert np.all(err <= tol * bound + 1e-30), f"{name} swizzle {swizzle}: max error {err.max()}"


@pytest.mark.parametrize("kind", ["exact", "random"])
@pytest.mark.parametrize("swizzle", SWIZZLES)
@pytest.mark.parametrize("name", WGMMA_SS)
def test_wgmma_from_swizzled_shared_memory(rng, name, swizzle, kind):
    _run_wgmma(rng, name, swizzle, kind, scale=1, regs=False)


@pytest.mark.parametrize("swizzle", [0, 128])
@pytest.mark.parametrize("name", WGMMA_MORE)
def test_wgmma_more_types_and_scale_d_zero(rng, name, swizzle):
    _run_wgmma(rng, name, swizzle, "exact", scale=1, regs=False)
    _run_wgmma(rng, name, swizzle, "exact", scale=0, regs=False)  # C ignored


@pytest.mark.parametrize("name", ["wgmma.m64n64k16.f32.f16.f16", "wgmma.m64n256k16.f32.bf16.bf16",
                                  "wgmma.m64n32k32.f32.e4m3.e5m2"])
def test_wgmma_with_a_from_registers(rng, name):
    _run_wgmma(rng, name, 128, "exact", scale=1, regs=True)
    _run_wgmma(rng, name, 64, "random", scale=1, regs=True)


@pytest.mark.parametrize("swizzle", SWIZZLES)
@pytest.mark.parametrize("name", ["wgmma.m64n64k16.f32.f16.f16", "wgmma.m64n128k16.f32.bf16.bf16",
                                  "wgmma.m64n256k16.f16.f16.f16"])
def test_wgmma_mn_major_operands(rng, name, swizzle):
    """imm-trans 1: both operands MN-major (A from shared), then B alone (A from registers),
    read through `descriptor_element_addresses(k_major=False)`'s model."""
    _run_wgmma(rng, name, swizzle, "exact", scale=1, regs=False, mn_major=True)
    _run_wgmma(rng, name, swizzle, "exact", scale=1, regs=True, mn_major=True)


@pytest.mark.parametrize("dtype,box,swizzle", [
    (f16, (64, 8), 128), (f16, (32, 16), 64), (f16, (16, 12), 32), (f16, (8, 16), 0),
    (f32, (32, 8), 128), (bf16, (64, 5), 128)])
@pytest.mark.parametrize("coords", [(0, 0), (40, 3), (-8, -3), (96, 27)])
def test_tma_load_lands_where_the_catalogue_says_with_zero_fill(rng, dtype, box, swizzle, coords):
    x = random_input(rng, (30, 104), dtype)  # rows of 16-byte multiples (TMA)
    x = np.where(x == 0, 1, x).astype(x.dtype)  # zero fill must be distinguishable
    words = box[0] * box[1] * dtype.bits // 32
    tx = to_device(x, dtype)
    tout = poison(torch.empty(words, dtype=torch.int32, device="cuda"))
    launch_raw(hh.raw_tma_kernel(dtype, box, swizzle), 1, tx, tout, *coords)
    want = hh.expected_tma_image(storage_bits(x, dtype), dtype, box, swizzle, coords)
    assert np.array_equal(bits_of(tout, i32).view(np.int32), want)


def test_mbarrier_phase_parity_hands_data_over_two_phases(rng):
    x = rng.integers(1, 1000, size=2).astype(np.int32)
    tout = poison(torch.empty(32, dtype=torch.int32, device="cuda"))
    launch_raw(hh.raw_mbarrier_kernel(), 1, to_device(x, i32), tout)
    assert np.all(bits_of(tout, i32).view(np.int32) == x[0] + 1000 * x[1])


def test_named_barrier_elect_setmaxnreg_and_tma_store(rng):
    x = rng.integers(1, 1 << 20, size=128).astype(np.int32)
    ty = poison(torch.empty(128, dtype=torch.int32, device="cuda"))
    tout = poison(torch.empty(32, dtype=torch.int32, device="cuda"))
    launch_raw(hh.raw_misc_kernel(), 1, to_device(x, i32), ty, tout)
    out = bits_of(tout, i32).view(np.int32)
    elected = out - 3 * x[:32]
    assert set(elected.tolist()) <= {0, 1} and elected.sum() == 1  # one lane of warp 1
    assert np.array_equal(bits_of(ty, i32).view(np.int32), x)
