"""TMA boxes and the asynchronous catalogue entries (mbarrier, bulk groups, fences, named
barriers, setmaxnreg), on the CPU; every Hopper template assembled by ptxas for sm_90a."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch import catalogue, get_instruction, get_target
from tegula.arch.tma import (ASYNC_INSTRUCTIONS, bulk_wait, get_async, setmaxnreg,
                             tma_box_addresses, tma_box_copy, tma_box_window, tma_load,
                             tma_reduce_add, tma_store, tma_store_box, wgmma_wait)
from tegula.dtypes import f16, f32, u8
from tegula.errors import TegulaError
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import hwcheck_hopper as hh  # noqa: E402  (micro-kernel builders shared with the GPU tests)


def _box_by_loops(g: np.ndarray, coords, box) -> np.ndarray:
    """The TMA load read element by element (tensor-map order: coords[0] is g's last axis)."""
    out = np.zeros(tuple(reversed(box)), dtype=g.dtype)
    for idx in np.ndindex(*out.shape):
        src = tuple(c + i for c, i in zip(reversed(coords), idx))
        if all(0 <= s < e for s, e in zip(src, g.shape)):
            out[idx] = g[src]
    return out


@pytest.mark.parametrize("coords", [(0, 0), (5, 3), (-4, 6), (14, -2), (30, 30), (-20, 0)])
def test_box_copy_zero_fills_outside_the_tensor(coords):
    rng = np.random.default_rng(abs(hash(coords)) % 1000)
    g = rng.normal(size=(9, 19)).astype(np.float32) + 10.0  # never zero
    g[2, 3] = np.nan
    got = tma_box_copy(g, coords, (8, 5))
    np.testing.assert_array_equal(got, _box_by_loops(g, coords, (8, 5)))
    assert got.shape == (5, 8)


def test_box_copy_three_dims_and_store_skips_outside():
    rng = np.random.default_rng(3)
    g = rng.integers(1, 100, size=(3, 5, 7))
    coords, box = (4, -1, 1), (4, 3, 4)
    np.testing.assert_array_equal(tma_box_copy(g, coords, box), _box_by_loops(g, coords, box))
    target = np.full((5, 6), -1)
    data = rng.integers(1, 100, size=(3, 4))
    tma_store_box(target, (4, 3), data)
    want = np.full((5, 6), -1)
    want[3:5, 4:6] = data[:2, :2]
    np.testing.assert_array_equal(target, want)
    with pytest.raises(TegulaError, match="rank"):
        tma_box_copy(g, (0, 0), (4, 4))


def test_box_addresses_dense_without_swizzle_and_a_permutation_with():
    got = tma_box_addresses((8, 3, 2), f16, 0, 256)
    assert got.shape == (2, 3, 8)
    assert np.array_equal(got.ravel(), 256 + 2 * np.arange(48))
    for swizzle, inner in ((32, 16), (64, 32), (128, 64)):
        addr = tma_box_addresses((inner, 13), f16, swizzle, 2048)
        assert sorted(addr.ravel()) == list(range(2048, 2048 + 13 * inner * 2, 2))
        for i, row in enumerate(addr):  # 16-byte chunks move only within their own row
            lo = 2048 + i * swizzle
            assert lo <= row.min() and row.max() < lo + swizzle
            assert np.array_equal(np.diff(row.reshape(-1, 8), axis=1), np.full((swizzle // 16, 7), 2))
        assert not np.array_equal(addr.ravel(), 2048 + 2 * np.arange(13 * inner))  # swizzled


@pytest.mark.parametrize("box,dtype,swizzle,base,match", [
    ((4, 4), f16, 0, 0, "multiple of 16 bytes"),
    ((32, 4), f16, 128, 0, "must equal the swizzle span"),
    ((64, 4), f16, 128, 512, "1024-byte aligned"),
    ((8, 4), f16, 0, 64, "128-byte aligned"),
    ((8, 300), f16, 0, 0, "1 to 256"),
    ((16, 1, 1, 1, 1, 1), u8, 0, 0, "1 to 5 dims"),
    ((32, 4), f32, 96, 0, "swizzle must be one of"),
])
def test_box_rules_are_named(box, dtype, swizzle, base, match):
    with pytest.raises(TegulaError, match=match):
        tma_box_addresses(box, dtype, swizzle, base)


def test_async_entries_lookup_and_targets():
    sm80, sm90, h200 = (get_target(t) for t in ("sm_80", "sm_90a", "h200"))
    for e in ASYNC_INSTRUCTIONS:
        assert get_instruction(e.name) is e and e.available_on(sm90) and e.available_on(h200)
        assert e.available_on(sm80) == (e.kind == "bar.named")
    assert tma_load(3).rank == 3 and tma_load(2, multicast=True).multicast
    assert "[%0], [%1, {%2, %3}], [%4], %5;" in tma_load(2, True).asm_text()
    assert tma_store(1).asm_text().endswith("[%0, {%1}], [%2];")
    assert get_instruction("cp.async.bulk.wait_group.read.2").asm_text() == \
        "cp.async.bulk.wait_group.read 2;"
    assert get_instruction("wgmma.wait_group.1") == wgmma_wait(1)
    assert get_async("setmaxnreg.inc.240").asm_text() == "setmaxnreg.inc.sync.aligned.u32 240;"
    assert setmaxnreg(40, False).available_on(sm90)
    names = {i.name for i in catalogue("sm_90a")}
    assert {"mbarrier.try_wait.parity", "tma.load.2d", "fence.proxy.async.shared::cta"} <= names
    wait = get_async("mbarrier.try_wait.parity").asm_text()
    assert "WAIT_%=:" in wait and "bra WAIT_%=;" in wait  # labels unique per asm statement


def test_reduce_add_entry_form_and_semantics():
    """`cp.reduce.async.bulk.tensor` .add (PTX ISA 8.0, sm_90): the tensor form with the
    map's element type, completed by bulk group; the emulator adds in f32 to nearest even
    keeping subnormals (as the H100 does; red.add.f32 flushes them)."""
    entry = tma_reduce_add(3)
    assert entry.name == "tma.reduce.add.3d" and entry.pipe == "tma" and entry.dtype == f32
    assert entry.asm_text() == ("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile"
                                ".bulk_group [%0, {%1, %2, %3}], [%4];")
    assert entry.available_on(get_target("sm_90a")) and entry.available_on(get_target("sm_90"))
    assert not entry.available_on(get_target("sm_89"))
    tiny = np.finfo(np.float32).tiny
    old = np.array([1.0, 16777216.0, 1e-39, 1.5 * tiny, tiny / 16], np.float32)
    add = np.array([2.0, 1.0, 0.0, -tiny / 2, tiny / 8], np.float32)
    # 2^24 + 1 rounds to even; subnormal operands and results are kept
    assert np.array_equal(entry.execute(old, add), np.array(
        [3.0, 16777216.0, 1e-39, tiny, 3 * tiny / 16], np.float32))
    g, b = tma_box_window((5, 7), (6, 3), (4, 4))   # map order: column 6, row 3
    assert (g, b) == ((slice(3, 5), slice(6, 7)), (slice(0, 2), slice(0, 1)))
    assert tma_box_window((5, 7), (7, 0), (4, 4)) is None


@pytest.mark.parametrize("call,match", [
    (lambda: bulk_wait(64), "0..63"), (lambda: wgmma_wait(8), "0..7"),
    (lambda: setmaxnreg(20, True), "multiple of 8 in 24..256"),
    (lambda: setmaxnreg(100, False), "multiple of 8"),
    (lambda: get_async("tma.load.6d"), "no asynchronous instruction"),
    (lambda: tma_store(0), "no asynchronous instruction"),
])
def test_bad_parameters_are_named(call, match):
    with pytest.raises(TegulaError, match=match):
        call()


def test_every_hopper_template_assembles_for_sm_90a():
    """The GPU micro-kernels and one kernel holding every async template and both forms of
    every wgmma type: ptxas rejects malformed PTX, wrong operand kinds and bad labels."""
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    kernels = hh.every_raw_hopper_kernel() + [hh.raw_every_template_kernel()]
    names = [k.name for k in kernels]
    assert len(set(names)) == len(names)
    cubin = compile_cuda("\n".join(k.source for k in kernels), names[0], "sm_90a")
    assert cubin[:4] == b"\x7fELF"


def test_wgmma_host_model_of_the_micro_kernel_round_trips():
    """The GPU test's host packing (image, fragments) inverts: what the kernel would read
    through the catalogue's descriptors and TV layouts is the matrix it was built from."""
    from tegula.arch.smem_matrix import descriptor_element_addresses, operand_descriptor
    from tegula.arch.wgmma import get_wgmma
    instr = get_wgmma("wgmma.m64n24k16.f32.f16.f16")
    rng = np.random.default_rng(5)
    for swizzle in (0, 32, 64, 128):
        k = hh.wgmma_k_total(instr, swizzle)
        a = rng.integers(1, 1 << 15, size=(64, k))
        b = rng.integers(1, 1 << 15, size=(24, k))
        image = hh.wgmma_image(instr, swizzle, a, b).view(np.uint16)
        for s in range(k // 16):
            da = operand_descriptor(64, k, f16, swizzle, 0, 16 * s)
            db = operand_descriptor(24, k, f16, swizzle, 64 * k * 2, 16 * s)
            ra = descriptor_element_addresses(da, 64, 16, f16) // 2
            rb = descriptor_element_addresses(db, 24, 16, f16) // 2
            assert np.array_equal(image[ra], a[:, 16 * s:16 * s + 16])
            assert np.array_equal(image[rb], b[:, 16 * s:16 * s + 16])
    c = rng.integers(0, 1 << 32, size=(64, 24)).astype(np.uint64)
    assert np.array_equal(hh.acc_matrix(instr, hh.acc_words(instr, c)), c)
