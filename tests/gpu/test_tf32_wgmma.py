"""The tf32 wgmma entries (`wgmma.m64n{N}k8.f32.tf32.tf32`) on hardware, through their own
`format_asm` text and the Hopper micro-kernel builders (`hwcheck_hopper.py`), like
test_hopper_instructions.py's wgmma tests: A and B from shared memory in every swizzle mode
(and A from registers), scale-d 1 and 0, against the entry's `execute`. Small integers are
exact in tf32, so D must be bit-exact; random f32 data (low mantissa bits set) must match
the entry's truncation model within f32 accumulation, and the failure message says whether
round-to-nearest (cvt.rna) would have matched instead. Needs sm_90a."""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.wgmma import get_wgmma
from tegula.dtypes import f32, i32

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers beside us
import hwcheck_hopper as hh  # noqa: E402
from gpu_helpers import bits_of, device_cc, launch_raw, poison, storage_bits, to_device  # noqa: E402

NAMES = [f"wgmma.m64n{n}k8.f32.tf32.tf32" for n in (8, 64, 128, 256)]


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _need_sm90a():
    if device_cc() < 90:
        pytest.skip("Hopper instructions need sm_90a")


def _rna_tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero (the other model)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x1000) >> 13 << 13) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def _run(rng, name: str, swizzle: int, kind: str, scale: int, regs: bool) -> None:
    instr = get_wgmma(name)
    k = hh.wgmma_k_total(instr, swizzle)
    shapes = ((64, k), (instr.n, k), (64, instr.n))
    if kind == "exact":
        a, b, c = (rng.integers(-3, 4, s).astype(np.float32) for s in shapes)
    else:
        a, b, c = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    a_bits, b_bits = storage_bits(a, f32), storage_bits(b, f32)
    image = hh.wgmma_image(instr, swizzle, a_bits, b_bits)
    frag = hh.a_fragment_words(instr, a_bits) if regs else np.zeros((128, 4), np.uint32)
    c_words = hh.acc_words(instr, storage_bits(c, f32).astype(np.uint64))
    timg, tfrag, tc = (to_device(x.astype(np.uint32).view(np.int32), i32)
                       for x in (image.view(np.uint32), frag, c_words))
    tout = poison(torch.empty_like(tc))
    launch_raw(hh.raw_wgmma_kernel(name, swizzle, regs), 1, timg, tfrag, tc, tout, scale)
    got = hh.acc_matrix(instr, bits_of(tout, i32).astype(np.uint32)).astype(np.uint32) \
        .view(np.float32).astype(np.float64)
    want = hh.expected_wgmma(instr, a, b, c, scale).astype(np.float64)
    if kind == "exact":
        assert np.array_equal(got, want), f"{name} swizzle {swizzle}: D differs from A·Bᵀ + C"
        return
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T + scale * np.abs(c)
    err = np.abs(got - want)
    rna = (_rna_tf32(a).astype(np.float64) @ _rna_tf32(b).astype(np.float64).T
           + scale * c.astype(np.float64))
    assert np.all(err <= 2.0 ** -18 * bound + 1e-30), (
        f"{name} swizzle {swizzle}: max error {err.max():.3g} against truncated tf32 "
        f"operands; against round-to-nearest operands {np.abs(got - rna).max():.3g}")


@pytest.mark.parametrize("kind", ["exact", "random"])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("name", NAMES)
def test_tf32_wgmma_from_swizzled_shared_memory(rng, name, swizzle, kind):
    _run(rng, name, swizzle, kind, scale=1, regs=False)


@pytest.mark.parametrize("name", ["wgmma.m64n64k8.f32.tf32.tf32", "wgmma.m64n256k8.f32.tf32.tf32"])
def test_tf32_wgmma_scale_d_zero_and_a_from_registers(rng, name):
    _run(rng, name, 128, "exact", scale=0, regs=False)   # C ignored
    _run(rng, name, 128, "exact", scale=1, regs=True)
    _run(rng, name, 64, "random", scale=1, regs=True)
