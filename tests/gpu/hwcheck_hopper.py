"""Micro-kernels that check the Hopper catalogue entries (`tegula.arch.wgmma`,
`tegula.arch.tma`) on hardware, through their own `format_asm` text.

As in `hwcheck` (whose raw-kernel helpers these reuse), every register <-> memory mapping
and every shared-memory address is derived from the catalogue (`acc_tv`, `a_tv`,
`canonical_byte_addresses`, `operand_descriptor`, `tma_box_addresses`), never from a second
transcription of the PTX ISA, so a wrong entry makes the kernel compute the wrong thing.

* `raw_wgmma_kernel(name, swizzle, a_from_regs)`: one warpgroup; the host writes A and B
  into a shared-memory image at the canonical (swizzled) addresses, the kernel copies the
  image to a 1024-byte-aligned buffer, fences it into the async proxy and runs one wgmma per
  k-step through descriptors from `operand_descriptor` (A from registers: packed by
  `a_tv`), accumulating onto C (or ignoring it when `scale` is 0).
* `raw_tma_kernel(dtype, box, swizzle)`: thread 0 arms an mbarrier with the box's bytes and
  issues one 2-D TMA load at run-time coordinates; everyone waits on phase parity 0; the
  raw shared bytes come back (expected: `expected_tma_image`).
* `raw_mbarrier_kernel()`: two warps hand data through two mbarriers over two phases.

The functions are compiled on the CPU by tests/arch/test_tma.py (ptxas rejects malformed
PTX) and run on a GPU by tests/gpu/test_hopper_instructions.py.
"""
from __future__ import annotations

import numpy as np

import hwcheck as hw
from tegula.arch.smem_matrix import canonical_byte_addresses, operand_descriptor
from tegula.arch.tma import (get_async, tma_box_addresses, tma_box_copy, tma_load,
                             wgmma_wait)
from tegula.arch.instructions import tv_table
from tegula.arch.wgmma import WARPGROUP, WgmmaInstr, get_wgmma
from tegula.codegen.params import TENSOR_MAP_STRUCT
from tegula.dtypes import DType, i32
from tegula.lower.async_ir import TensorMapParam
from tegula.lower.thread_ir import ScalarParam, SharedBuffer, TensorParam

#: Extra dynamic shared bytes so the kernel can align its buffer to 1024 itself.
_ALIGN_SLACK = 1024
_ALIGN = ["const unsigned base = (saddr + 1023u) & ~1023u;",
          "unsigned char* const sbuf = smem + (base - saddr);"]


def _with_tensor_map_struct(raw: hw.RawKernel) -> hw.RawKernel:
    """The kernel with the tensor-map struct declared first (guarded: several raw kernels
    share one translation unit in the compile test)."""
    struct = f"#ifndef TG_TENSOR_MAP\n#define TG_TENSOR_MAP\n{TENSOR_MAP_STRUCT}\n#endif\n"
    return hw.RawKernel(raw.signature, struct + raw.source)


def _asm(name: str, **groups) -> str:
    return get_async(name).format_asm(**groups)


# --------------------------------------------------------------------------------------
# wgmma
# --------------------------------------------------------------------------------------


def wgmma_k_total(instr: WgmmaInstr, swizzle: int, mn_major: bool = False) -> int:
    """K of the test: two column blocks of the canonical buffer, or two k-steps, whichever
    is more, so descriptors advance both inside a swizzle atom and across blocks (MN-major:
    two k-steps, each two groups of 8 K rows)."""
    if mn_major:
        return 2 * instr.k
    block = max(swizzle, 16) * 8 // instr.a_dtype.bits
    return 2 * max(block, instr.k)


def wgmma_image(instr: WgmmaInstr, swizzle: int, a_bits: np.ndarray,
                b_bits: np.ndarray, mn_major: bool = False) -> np.ndarray:
    """The shared-memory image (int32 words) holding A (64, K) and B (N, K) bit patterns at
    their canonical addresses (MN-major buffers when `mn_major`): A at byte 0, B after."""
    k_total = a_bits.shape[1]
    eb = instr.a_dtype.bits // 8
    a_bytes = 64 * k_total * eb
    image = np.zeros(a_bytes + instr.n * k_total * eb, dtype=np.uint8)
    for bits, rows, start, dt in ((a_bits, 64, 0, instr.a_dtype),
                                  (b_bits, instr.n, a_bytes, instr.b_dtype)):
        addr = canonical_byte_addresses(rows, k_total, dt, swizzle, start,
                                        k_major=not mn_major)
        raw = np.ascontiguousarray(bits.astype(f"<u{eb}")).view(np.uint8).reshape(rows, k_total, eb)
        for byte in range(eb):
            image[addr + byte] = raw[:, :, byte]
    return image.view(np.int32)


def acc_words(instr: WgmmaInstr, c_bits: np.ndarray) -> np.ndarray:
    """C (64, N) bit patterns -> each thread's accumulator registers [128, acc_regs]."""
    table = tv_table(instr.acc_tv, WARPGROUP)
    vals = c_bits[table % 64, table // 64]
    bits = instr.acc_dtype.bits
    return hw.pack_words(vals, bits) if bits < 32 else vals.astype(np.uint32)


def acc_matrix(instr: WgmmaInstr, words: np.ndarray) -> np.ndarray:
    """Inverse of `acc_words`: [128, acc_regs] words -> D (64, N) bit patterns."""
    bits = instr.acc_dtype.bits
    vals = hw.unpack_words(words, bits) if bits < 32 else words.astype(np.uint64)
    table = tv_table(instr.acc_tv, WARPGROUP)
    out = np.zeros((64, instr.n), dtype=np.uint64)
    out[table % 64, table // 64] = vals
    return out


def a_fragment_words(instr: WgmmaInstr, a_bits: np.ndarray) -> np.ndarray:
    """A (64, K_total) bit patterns -> [128, steps * a_regs] words, step after step, each
    step's registers by `a_tv`."""
    table = tv_table(instr.a_tv, WARPGROUP)
    steps = a_bits.shape[1] // instr.k
    words = []
    for s in range(steps):
        part = a_bits[:, s * instr.k:(s + 1) * instr.k]
        words.append(hw.pack_words(part[table % 64, table // 64], instr.a_dtype.bits))
    return np.concatenate(words, axis=1)


def raw_wgmma_kernel(name: str, swizzle: int, a_from_regs: bool = False,
                     mn_major: bool = False) -> hw.RawKernel:
    """D = C·scale + A·Bᵀ over `wgmma_k_total` K by one warpgroup (see module doc); with
    `mn_major` the shared operands are MN-major (imm-trans 1) buffers.

    Parameters: img (words of `wgmma_image`), afrag (128, steps*a_regs) words (read only
    with `a_from_regs`), c (128, acc_regs) words, out (128, acc_regs) words, scale (int)."""
    instr = get_wgmma(name)
    k_total = wgmma_k_total(instr, swizzle, mn_major)
    steps = k_total // instr.k
    eb = instr.a_dtype.bits // 8
    a_bytes = 64 * k_total * eb
    words = (a_bytes + instr.n * k_total * eb) // 4
    regs = instr.acc_regs
    acc_t = "float" if instr.acc_dtype.bits == 32 else "unsigned"
    load = "__uint_as_float((unsigned)c[lane * c_stride0 + i])" if acc_t == "float" \
        else "(unsigned)c[lane * c_stride0 + i]"
    store = "__float_as_int(d[i])" if acc_t == "float" else "(int)d[i]"
    d = [f"d[{i}]" for i in range(regs)]
    body = [*_ALIGN,
            "unsigned* const img32 = reinterpret_cast<unsigned*>(sbuf);",
            f"for (int i = lane; i < {words}; i += {WARPGROUP}) img32[i] = (unsigned)img[i];",
            _asm("fence.proxy.async.shared::cta"),
            "__syncthreads();",
            f"{acc_t} d[{regs}];",
            f"for (int i = 0; i < {regs}; ++i) d[i] = {load};",
            "const unsigned long long sa = (unsigned long long)(base >> 4);",
            _asm("wgmma.fence")]
    for s in range(steps):
        da = operand_descriptor(64, k_total, instr.a_dtype, swizzle, 0, s * instr.k,
                                k_major=not mn_major).encode()
        db = operand_descriptor(instr.n, k_total, instr.b_dtype, swizzle, a_bytes,
                                s * instr.k, k_major=not mn_major).encode()
        scale = "scale" if s == 0 else "1"
        if a_from_regs:
            a = [f"(unsigned)afrag[lane * afrag_stride0 + {s * instr.a_regs + r}]"
                 for r in range(instr.a_regs)]
        else:
            a = f"({da:#x}ull + sa)"
        t = int(mn_major)
        body.append(instr.format_asm(d=d, a=a, b=f"({db:#x}ull + sa)", scale_d=scale,
                                     trans_a=0 if a_from_regs else t, trans_b=t))
    body += [_asm("wgmma.commit_group"), wgmma_wait(0).format_asm(),
             f"for (int i = 0; i < {regs}; ++i) out[lane * out_stride0 + i] = {store};"]
    params = [TensorParam("img", i32, 1), TensorParam("afrag", i32, 2),
              TensorParam("c", i32, 2), TensorParam("out", i32, 2, writes=True),
              ScalarParam("scale", i32)]
    smem = [SharedBuffer("img", i32, (words * 4 + _ALIGN_SLACK) // 4, 0)]
    tag = ("rs" if a_from_regs else "ss") + ("_mn" if mn_major else "")
    return hw._raw(f"raw_{name.replace('.', '_')}_{tag}_sw{swizzle}", WARPGROUP, params, body,
                   smem)


def expected_wgmma(instr: WgmmaInstr, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                   scale: int) -> np.ndarray:
    """D after the k-steps, by the entry's own `execute` (values, accumulator type)."""
    d = c
    for s in range(a.shape[1] // instr.k):
        ks = slice(s * instr.k, (s + 1) * instr.k)
        d = instr.execute(d, a[:, ks], b[:, ks], scale if s == 0 else 1)
    return d


# --------------------------------------------------------------------------------------
# TMA and mbarriers
# --------------------------------------------------------------------------------------

#: What shared memory holds before the TMA load (a zero-filled element must overwrite it).
SENTINEL_WORD = 0x5A5A5A5A


def raw_tma_kernel(dtype: DType, box: tuple[int, int], swizzle: int) -> hw.RawKernel:
    """One 2-D TMA load of a `box` (tensor-map order: inner, outer) of tensor `x`
    (rows, cols) at coordinates (c0, c1) into a SENTINEL-filled 1024-aligned buffer, waited
    for through an mbarrier (init, fence, expect_tx, try_wait.parity 0); out gets the
    buffer's raw words. Parameters: x (2-D, dtype), tmap (its tensor map), out (words,),
    c0, c1 (int)."""
    box_bytes = box[0] * box[1] * dtype.bits // 8
    words = box_bytes // 4
    bar_off = ((box_bytes + 7) // 8) * 8
    body = [*_ALIGN,
            "unsigned* const img32 = reinterpret_cast<unsigned*>(sbuf);",
            f"const unsigned bar = base + {bar_off}u;",
            f"for (int i = lane; i < {words}; i += blockDim.x) img32[i] = {SENTINEL_WORD:#x}u;",
            "if (lane == 0) {",
            "  " + _asm("mbarrier.init", bar="bar", count="1"),
            "  " + _asm("fence.mbarrier_init.release.cluster"),
            "}",
            _asm("fence.proxy.async.shared::cta"),
            "__syncthreads();",
            "if (lane == 0) {",
            "  " + _asm("mbarrier.arrive.expect_tx", bar="bar", tx=f"{box_bytes}u"),
            "  " + tma_load(2).format_asm(dst="base", tmap="(unsigned long long)&tmap",
                                          coords=["c0", "c1"], bar="bar"),
            "}",
            _asm("mbarrier.try_wait.parity", bar="bar", parity="0u"),
            f"for (int i = lane; i < {words}; i += blockDim.x) out[i] = (int)img32[i];"]
    params = [TensorParam("x", dtype, 2),
              TensorMapParam("tmap", "x", dtype, (1, 0), tuple(box), swizzle),
              TensorParam("out", i32, 1, writes=True),
              ScalarParam("c0", i32), ScalarParam("c1", i32)]
    smem = [SharedBuffer("buf", i32, (bar_off + 8 + _ALIGN_SLACK) // 4, 0)]
    name = f"raw_tma_2d_{dtype.name}_{box[0]}x{box[1]}_sw{swizzle}"
    return _with_tensor_map_struct(hw._raw(name, 64, params, body, smem))


def expected_tma_image(x_bits: np.ndarray, dtype: DType, box: tuple[int, int], swizzle: int,
                       coords: tuple[int, int]) -> np.ndarray:
    """The buffer's words after the load: the box (zero outside the tensor) at
    `tma_box_addresses` (relative to the aligned buffer)."""
    eb = dtype.bits // 8
    data = tma_box_copy(x_bits, coords, box)  # (box[1], box[0]) bit patterns
    addr = tma_box_addresses(box, dtype, swizzle, 0)
    image = np.zeros(box[0] * box[1] * eb, dtype=np.uint8)
    raw = np.ascontiguousarray(data.astype(f"<u{eb}")).view(np.uint8).reshape(*data.shape, eb)
    for byte in range(eb):
        image[addr + byte] = raw[..., byte]
    return image.view(np.int32)


def raw_mbarrier_kernel() -> hw.RawKernel:
    """Warp 1 hands x[0] and then x[1] to warp 0 through barrier `full` (32 arrivals per
    phase), waiting in between on barrier `empty` (warp 0's 32 arrivals) for warp 0 to have
    read the first value; warp 0 waits on `full` with parity 0, then 1. out[lane] (warp 0)
    = x[0] + 1000 * x[1] as warp 0 read them (a wrong parity reads a stale or
    unwritten value, or hangs)."""
    body = [*_ALIGN,
            "volatile int* const data = reinterpret_cast<volatile int*>(sbuf);",
            "const unsigned full = base + 64u, empty = base + 72u;",
            "if (lane == 0) {",
            "  " + _asm("mbarrier.init", bar="full", count="32"),
            "  " + _asm("mbarrier.init", bar="empty", count="32"),
            "  data[0] = -1; data[1] = -1;",
            "}",
            "__syncthreads();",
            "if (lane >= 32) {",
            "  if (lane == 32) data[0] = x[0];",
            "  " + _asm("mbarrier.arrive", bar="full"),
            "  " + _asm("mbarrier.try_wait.parity", bar="empty", parity="0u"),
            "  if (lane == 32) data[1] = x[1];",
            "  " + _asm("mbarrier.arrive", bar="full"),
            "} else {",
            "  " + _asm("mbarrier.try_wait.parity", bar="full", parity="0u"),
            "  const int first = data[0];",
            "  " + _asm("mbarrier.arrive", bar="empty"),
            "  " + _asm("mbarrier.try_wait.parity", bar="full", parity="1u"),
            "  out[lane] = first + 1000 * data[1];",
            "}"]
    params = [TensorParam("x", i32, 1), TensorParam("out", i32, 1, writes=True)]
    smem = [SharedBuffer("buf", i32, (128 + _ALIGN_SLACK) // 4, 0)]
    return hw._raw("raw_mbarrier_phases", 64, params, body, smem)


def raw_misc_kernel() -> hw.RawKernel:
    """The remaining entries in one kernel: named barriers (bar.arrive / bar.sync between
    two warps), elect.sync, setmaxnreg (dec then inc on a warpgroup), a TMA store and the
    bulk group commit/wait. out[t] = 1 + (elected lane of its warp); y gets x's box back
    through the store (Parameters: x, tmap_x (for the store into y's map), y, out)."""
    body = [*_ALIGN,
            "int* const img = reinterpret_cast<int*>(sbuf);",
            get_async("setmaxnreg.dec.40").format_asm(),
            get_async("setmaxnreg.inc.232").format_asm(),
            "unsigned elected;",
            get_async("elect.sync").format_asm(d="elected"),
            "if (lane < 32) { img[lane] = x[lane] * 3; "
            + _asm("bar.arrive", id="1u", threads="64u") + " }",
            "else if (lane < 64) { " + _asm("bar.sync", id="1u", threads="64u")
            + " out[lane - 32] = img[lane - 32] + (int)elected; }",
            "__syncthreads();",
            "img[64 + lane] = x[lane];",
            _asm("fence.proxy.async.shared::cta"),
            "__syncthreads();",
            "if (lane == 0) {",
            "  " + get_async("tma.store.1d").format_asm(tmap="(unsigned long long)&ymap",
                                                         coords=["0"], src="base + 256u"),
            "  " + _asm("cp.async.bulk.commit_group"),
            "  " + get_async("cp.async.bulk.wait_group.read.0").format_asm(),
            "  " + get_async("cp.async.bulk.wait_group.0").format_asm(),
            "}"]
    params = [TensorParam("x", i32, 1), TensorParam("y", i32, 1, writes=True),
              TensorMapParam("ymap", "y", i32, (0,), (128,), 0),
              TensorParam("out", i32, 1, writes=True)]
    smem = [SharedBuffer("buf", i32, (1024 + _ALIGN_SLACK) // 4, 0)]
    return _with_tensor_map_struct(hw._raw("raw_hopper_misc", 128, params, body, smem))


def every_raw_hopper_kernel() -> list[hw.RawKernel]:
    """One kernel per entry family and shape class (what the CPU compile test assembles)."""
    kernels = [raw_wgmma_kernel(f"wgmma.m64n{n}k16.f32.f16.f16", sw)
               for n in (8, 64, 256) for sw in (0, 32, 64, 128)]
    kernels += [raw_wgmma_kernel(name, 128, regs) for regs in (False, True)
                for name in ("wgmma.m64n128k16.f32.bf16.bf16", "wgmma.m64n64k16.f16.f16.f16",
                             "wgmma.m64n32k32.f32.e4m3.e5m2")]
    kernels += [raw_wgmma_kernel("wgmma.m64n64k16.f32.f16.f16", sw, regs, mn_major=True)
                for sw in (0, 128) for regs in (False, True)]
    from tegula.dtypes import f16
    kernels += [raw_tma_kernel(f16, (64, 8), 128), raw_tma_kernel(f16, (8, 16), 0),
                raw_mbarrier_kernel(), raw_misc_kernel()]
    return kernels


def raw_every_template_kernel(wgmma_ns: tuple[int, ...] = (8, 136, 256)) -> hw.RawKernel:
    """Every asynchronous entry's `format_asm`, and both forms of every wgmma type at the
    N in `wgmma_ns` (all 32 N take ptxas minutes; the templates differ only in N), in one
    kernel, each in its own branch (compiled by the CPU test so ptxas checks every
    template; never run)."""
    from tegula.arch.tma import ASYNC_INSTRUCTIONS, bulk_wait, setmaxnreg
    from tegula.arch.wgmma import WGMMA_INSTRUCTIONS
    values = {"dst": "base", "bar": "base", "src": "base", "tmap": "(unsigned long long)&tmap",
              "count": "1u", "tx": "16u", "parity": "0u", "id": "1u", "threads": "128u",
              "mask": "(unsigned short)3", "d": "r0", "cta": "0u", "after": "r0"}
    body = [*_ALIGN, "unsigned r0 = 0;", "int branch = 0;"]
    entries = list(ASYNC_INSTRUCTIONS) + [bulk_wait(1), bulk_wait(2, read=True), wgmma_wait(1),
                                          setmaxnreg(24, False), setmaxnreg(256, True)]
    for i, e in enumerate(entries):
        groups = {o.name: (["(int)lane"] * o.count if o.name == "coords" else values[o.name])
                  for o in e.operands}
        body.append(f"if (sel == {i}) {{ {e.format_asm(**groups)} }}")
    for j, w in enumerate(WGMMA_INSTRUCTIONS):
        if w.n not in wgmma_ns:
            continue
        t = "float" if w.acc_dtype.bits == 32 else "unsigned"
        d = [f"d[{q}]" for q in range(w.acc_regs)]
        regs = ["r0"] * w.a_regs
        body.append(f"if (sel == {1000 + j}) {{ {t} d[{w.acc_regs}] = {{}}; "
                    + w.format_asm(d=d, a="(unsigned long long)base", b="0ull", scale_d="sel")
                    + " " + w.format_asm(d=d, a=regs, b="0ull", scale_d="1")
                    + f" for (int q = 0; q < {w.acc_regs}; ++q) out[q] = (int)d[q]; }}")
    body.append("out[0] += (int)r0 + branch;")
    params = [TensorParam("x", i32, 2), TensorMapParam("tmap", "x", i32, (1, 0), (4, 4), 0),
              TensorParam("out", i32, 1, writes=True), ScalarParam("sel", i32)]
    smem = [SharedBuffer("buf", i32, (1024 + _ALIGN_SLACK) // 4, 0)]
    return _with_tensor_map_struct(hw._raw("raw_every_hopper_template", 128, params, body, smem))
