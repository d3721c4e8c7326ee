"""The asynchronous thread IR (`lower/async_ir.py`) printed as CUDA: every statement in a
hand-built kernel compiles with NVRTC for sm_90a, its PTX is its catalogue entry's, the
Hopper samples compile to the SASS they ask for, and bad input (an sm_80 target, a
__syncthreads inside a role, a barrier past its array, a misaligned swizzled buffer, ...)
is a `CodegenError` saying what and where instead of a kernel that hangs or misreads."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from tegula.arch import tma as tma_entries
from tegula.arch.wgmma import get_wgmma
from tegula.codegen import CodegenError, emit_cuda
from tegula.codegen.samples import HOPPER_SAMPLES, warp_specialized_gemm
from tegula.dtypes import f16, f32
from tegula.lower.async_ir import (
    BulkCommit, BulkWait, ClusterBarrier, FenceBarrierInit, FenceProxyAsync, MBarrierArray, MBarrierArrive,
    MBarrierInit, MBarrierWait, NamedBarrier, PrefetchTensorMap, Role, Roles, SmemDesc,
    StMatrix, TensorMapParam, TmaLoad,
    TmaStore, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait,
)
from tegula.lower.thread_ir import (
    TID, Barrier, Const, Reg, RegArray, SharedBuffer, TensorParam, ThreadKernel, Var,
)
from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble

COMPILERS = available_compilers()
needs_compiler = pytest.mark.skipif(
    not COMPILERS, reason="neither NVRTC (cuda-bindings + nvidia-cuda-nvrtc) nor nvcc found")

BUF = SharedBuffer("tile", f16, 64 * 64, 0)          # one 64 x 64 f16 box: 8 KiB
ACC = RegArray("acc", f32, 32)                        # m64n64 f32 fragment
A_REGS = RegArray("a_frag", f16, 8)                   # m64k16 f16 A fragment
DESC = SmemDesc("tile", Const(0), leading_bytes=16, stride_bytes=1024, swizzle=128)
WGMMA = "wgmma.m64n64k16.f32.f16.f16"


def _kernel(*body, threads: int = 128, registers=(), name: str = "k") -> ThreadKernel:
    """A kernel around `body`: a 128-byte-swizzled f16 tile, two mbarriers after it, and a
    2-D f16 tensor `x` with its tensor map (64 x 64 boxes)."""
    return ThreadKernel(
        name=name, threads=threads,
        params=[TensorParam("x", f16, 2, writes=True),
                TensorMapParam("x_map", "x", f16, dims=(1, 0), box=(64, 64), swizzle=128)],
        registers=list(registers), shared=[BUF], body=list(body),
        mbarriers=[MBarrierArray("bar", 2, 8192)])


ONE = TID.eq(0)
COORDS = [Var("bid_x") * 64, Const(0)]

#: Per statement: (the kernel exercising it, the PTX its entry prints, which must appear).
STATEMENTS = {
    "MBarrierInit": ([MBarrierInit("bar", Const(1), 128, pred=ONE)],
                     "mbarrier.init.shared::cta.b64"),
    "FenceBarrierInit": ([FenceBarrierInit()], "fence.mbarrier_init.release.cluster"),
    "MBarrierArrive": ([MBarrierArrive("bar", TID % 2)], "mbarrier.arrive.shared::cta.b64"),
    "MBarrierArrive.expect_tx": ([MBarrierArrive("bar", Const(0), pred=ONE, tx_bytes=8192)],
                                 "mbarrier.arrive.expect_tx.shared::cta.b64"),
    "MBarrierArrive.remote": ([MBarrierArrive("bar", Const(1), pred=TID.eq(32), cta=Const(0))],
                              "mbarrier.arrive.shared::cluster.b64"),
    "ClusterBarrier": ([ClusterBarrier()], "barrier.cluster.wait.acquire.aligned"),
    "StMatrix": ([StMatrix([Reg(A_REGS, Const(i)) for i in range(8)], 4, False, "tile",
                           (TID % 32) * 8)], "stmatrix.sync.aligned.m8n8.x4.shared.b16"),
    "MBarrierWait": ([MBarrierWait("bar", Const(1), parity=Var("bid_x") % 2)],
                     "mbarrier.try_wait.parity.shared::cta.b64"),
    "TmaLoad": ([TmaLoad("tile", Const(0), "x_map", COORDS, "bar", Const(0), pred=ONE)],
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"),
    "TmaStore": ([TmaStore("x_map", COORDS, "tile", Const(0), pred=ONE)],
                 "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"),
    "PrefetchTensorMap": ([PrefetchTensorMap("x_map")], "prefetch.tensormap"),
    "BulkCommit": ([BulkCommit()], "cp.async.bulk.commit_group"),
    "BulkWait": ([BulkWait(1)], "cp.async.bulk.wait_group 1"),
    "BulkWait.read": ([BulkWait(0, read_only=True)], "cp.async.bulk.wait_group.read 0"),
    "FenceProxyAsync": ([FenceProxyAsync()], "fence.proxy.async.shared::cta"),
    "WgmmaFence": ([WgmmaFence()], "wgmma.fence.sync.aligned"),
    "Wgmma": ([Wgmma(WGMMA, [Reg(ACC, Const(i)) for i in range(32)], DESC, DESC,
                     scale_d=Var("bid_x"))],
              "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"),
    "Wgmma.a_registers": ([Wgmma(WGMMA, [Reg(ACC, Const(i)) for i in range(32)],
                                 [Reg(A_REGS, Const(i)) for i in range(8)], DESC,
                                 scale_d=Const(1), trans_b=1)],
                          "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"),
    "WgmmaCommit": ([WgmmaCommit()], "wgmma.commit_group.sync.aligned"),
    "WgmmaWait": ([WgmmaWait(1)], "wgmma.wait_group.sync.aligned 1"),
    "NamedBarrier": ([NamedBarrier(3, 64)], "bar.sync"),
    "Roles": ([Roles([Role("consumer", TID.lt(128), [NamedBarrier(1, 128)], 232),
                      Role("producer", TID.ge(128), [NamedBarrier(2, 256)], 40)])],
              "setmaxnreg.inc.sync.aligned.u32 232"),
}


def _statement_kernel(key: str) -> ThreadKernel:
    body, _ = STATEMENTS[key]
    threads = 384 if key == "Roles" else 128  # 384: an even share of 168 registers
    return _kernel(*body, threads=threads, registers=(ACC, A_REGS),
                   name="k_" + key.replace(".", "_"))


@needs_compiler
@pytest.mark.parametrize("key", sorted(STATEMENTS))
def test_statement_compiles_for_sm90a(key):
    kernel = _statement_kernel(key)
    source = emit_cuda(kernel, "sm_90a")
    assert STATEMENTS[key][1] in source
    cubin = compile_cuda(source, kernel.name, "sm_90a")
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("key", sorted(set(STATEMENTS) - {"NamedBarrier"}))
def test_statement_refused_for_sm80(key):
    # (Named barriers exist since sm_70; the Roles kernel is refused for its setmaxnreg.)
    with pytest.raises(CodegenError) as info:
        emit_cuda(_statement_kernel(key), "sm_80")
    message = str(info.value)
    assert "sm_80" in message and f"kernel k_{key.replace('.', '_')}" in message


@needs_compiler
def test_tma_multicast_load_compiles_for_a_cluster():
    kernel = _kernel(TmaLoad("tile", Const(0), "x_map", COORDS, "bar", Const(0), pred=ONE,
                             multicast=0b11), name="k_multicast")
    kernel.cluster = (2, 1, 1)
    source = emit_cuda(kernel, "sm_90a")
    assert ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" in source
    assert '"h"((unsigned short)0x3)' in source
    sass = _sass(kernel)
    assert "UTMALDG.2D.MULTICAST" in sass


@needs_compiler
def test_remote_arrive_and_cluster_barrier_compile_for_a_cluster():
    """The peer's barrier through mapa, and the cluster barrier, in a 2-CTA cluster."""
    kernel = _kernel(ClusterBarrier(), MBarrierArrive("bar", Const(0), pred=ONE,
                                                      cta=Var("bid_x") % 2),
                     ClusterBarrier(), name="k_remote")
    kernel.cluster = (2, 1, 1)
    source = emit_cuda(kernel, "sm_90a")
    assert "mapa.shared::cluster.u32" in source
    sass = _sass(kernel)
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass
    # The arrive alone is one SYNCS.ARRIVE with no GPU-wide memory barrier before it (the
    # consumer releases a stage per K step this way).
    alone = _kernel(MBarrierArrive("bar", Const(0), pred=ONE, cta=Var("bid_x") % 2),
                    name="k_remote_alone")
    alone.cluster = (2, 1, 1)
    sass = _sass(alone)
    assert "SYNCS.ARRIVE" in sass and "MEMBAR.ALL.GPU" not in sass


def test_remote_arrive_outside_the_cluster_or_with_bytes_is_refused():
    kernel = _kernel(MBarrierArrive("bar", Const(0), pred=ONE, cta=Const(2)), name="k_far")
    kernel.cluster = (2, 1, 1)
    with pytest.raises(CodegenError, match="CTA 2 is outside the kernel's cluster"):
        emit_cuda(kernel, "sm_90a")
    kernel = _kernel(MBarrierArrive("bar", Const(0), pred=ONE, cta=Const(1), tx_bytes=16),
                     name="k_bytes")
    with pytest.raises(CodegenError, match="carries no expect-tx bytes"):
        emit_cuda(kernel, "sm_90a")


def test_named_barrier_alone_compiles_for_sm80():
    # bar.sync with an id is older than Hopper: a kernel with only that is fine on sm_80.
    source = emit_cuda(_kernel(NamedBarrier(3, 64)), "sm_80")
    assert 'bar.sync %0, %1;' in source


def test_wgmma_and_setmaxnreg_need_the_arch_specific_target():
    # sm_90 (no "a") has TMA and mbarriers but neither wgmma nor setmaxnreg.
    emit_cuda(_statement_kernel("TmaLoad"), "sm_90")
    for key in ("Wgmma", "Roles"):
        with pytest.raises(CodegenError, match="sm_90a"):
            emit_cuda(_statement_kernel(key), "sm_90")


def test_ptx_comes_from_the_catalogue_entries():
    source = emit_cuda(_statement_kernel("MBarrierWait"), "sm_90a")
    assert tma_entries.get_async("mbarrier.try_wait.parity").asm_text() in source
    source = emit_cuda(_statement_kernel("Wgmma"), "sm_90a")
    assert get_wgmma(WGMMA).ptx in source


def test_descriptor_is_catalogue_encoding_plus_runtime_start_address():
    from tegula.arch.smem_matrix import encode_descriptor
    source = emit_cuda(_statement_kernel("Wgmma"), "sm_90a")
    const = encode_descriptor(0, 16, 1024, 128)
    # high word a constant; low word the constant part plus the run-time start field
    assert f"((0x{const >> 32:08x}ull << 32) | (unsigned)(0x{const & 0xFFFFFFFF:08x}u + " \
           f"(((tile_saddr" in source
    assert ">> 4) & 0x3FFFu) + 0u)" in source


def test_async_kernels_align_shared_memory_to_1024_others_keep_128():
    assert "extern __shared__ __align__(1024)" in emit_cuda(_statement_kernel("TmaLoad"))
    plain = _kernel(Barrier())
    plain.mbarriers = []
    assert "extern __shared__ __align__(128)" in emit_cuda(plain)


def test_mbarrier_addresses():
    source = emit_cuda(_kernel(MBarrierInit("bar", Const(1), 1), MBarrierArrive("bar", TID % 2)))
    assert "const unsigned bar_saddr = smem_saddr + 8192u;  // 2 mbarriers" in source
    assert '"r"(bar_saddr + 8u)' in source
    assert '"r"(bar_saddr + (unsigned)(tid % 2) * 8u)' in source


# --------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------

def _compilers():
    kinds = {c.kind: c for c in COMPILERS}
    return [pytest.param(kinds.get(k), id=k,
                         marks=pytest.mark.skipif(k not in kinds, reason=f"{k} not available"))
            for k in ("nvrtc", "nvcc")]


@pytest.mark.parametrize("compiler", _compilers())
@pytest.mark.parametrize("sample", sorted(HOPPER_SAMPLES))
def test_hopper_sample_compiles(sample, compiler):
    kernel = HOPPER_SAMPLES[sample]()
    cubin = compile_cuda(emit_cuda(kernel, "sm_90a"), kernel.name, "sm_90a", compiler=compiler)
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("sample", sorted(HOPPER_SAMPLES))
def test_hopper_sample_refused_for_sm80(sample):
    with pytest.raises(CodegenError, match="sm_80"):
        emit_cuda(HOPPER_SAMPLES[sample](), "sm_80")


def _sass(kernel: ThreadKernel) -> str:
    if not COMPILERS:
        pytest.skip("no CUDA compiler")
    text = disassemble(compile_cuda(emit_cuda(kernel, "sm_90a"), kernel.name, "sm_90a"))
    if text is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    return text


def test_sass_warp_specialized_gemm():
    sass = _sass(warp_specialized_gemm())
    for op in ("HGMMA.64x64x16.F32", "UTMALDG.2D", "SYNCS.ARRIVE.TRANS64",
               "SYNCS.PHASECHK.TRANS64.TRYWAIT", "USETMAXREG", "WARPGROUP.DEPBAR.LE"):
        assert op in sass, op
    assert not re.search(r"\b(LDL|STL)\b", sass), "accumulators fell back to local memory"


def test_sass_wgmma_n256_keeps_128_accumulators_in_registers():
    # 128 "+f" operands plus descriptors and scale-d in one asm statement (as CUTLASS).
    sass = _sass(warp_specialized_gemm(block_n=256))
    assert "HGMMA.64x256x16.F32" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_tma_round_trip_sass():
    sass = _sass(HOPPER_SAMPLES["tma_round_trip"]())
    assert "UTMALDG.2D" in sass and "UTMASTG.2D" in sass and "FENCE.VIEW.ASYNC.S" in sass


def test_gemm_sample_epilogue_matches_the_accumulator_layout():
    # The sample writes value v of thread t to c[row, col] by the PTX ISA's formula; the
    # catalogue's acc_tv maps (t, v) to row + 64*col. They must agree for every element.
    table = get_wgmma("wgmma.m64n64k16.f32.f16.f16").tables()[0]
    t = np.arange(128)[:, None]
    v = np.arange(32)[None, :]
    row = (t // 32) * 16 + (t % 32) // 4 + ((v // 2) % 2) * 8
    col = (t % 4) * 2 + v % 2 + (v // 4) * 8
    np.testing.assert_array_equal(row + 64 * col, table)


@pytest.mark.parametrize("threads", [256, 384])
def test_setmaxnreg_direction_matches_ptxas_allocation(threads):
    """`setmaxnreg.dec` must not ask for more than ptxas allocated, `.inc` not for less.
    With setmaxnreg present, ptxas gives the kernel the whole per-thread share of the
    register file under __launch_bounds__(threads, 1) — what the emitter assumes."""
    from tegula.runtime.compiler import find_cuobjdump
    tool = find_cuobjdump() if COMPILERS else None
    if tool is None:
        pytest.skip("cuobjdump not available")
    kernel = _kernel(Roles([Role("consumer", TID.lt(128), [NamedBarrier(1, 128)], 232),
                            Role("producer", TID.ge(128), [NamedBarrier(2, threads - 128)], 40)]),
                     threads=threads, name="k_regs")
    source = emit_cuda(kernel, "sm_90a")
    assert f"__launch_bounds__({threads}, 1)" in source
    cubin = compile_cuda(source, kernel.name, "sm_90a")
    import os
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    allocated = int(re.search(r"REG:(\d+)", usage).group(1))
    share = min(255, 65536 // threads) // 8 * 8
    assert share <= allocated < share + 8
    inc = "inc" if 232 > share else "dec"
    assert f"setmaxnreg.{inc}.sync.aligned.u32 232" in source
    assert "setmaxnreg.dec.sync.aligned.u32 40" in source


# --------------------------------------------------------------------------------------
# Clear errors
# --------------------------------------------------------------------------------------

def _refused(kernel: ThreadKernel, *fragments: str) -> None:
    with pytest.raises(CodegenError) as info:
        emit_cuda(kernel, "sm_90a")
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_syncthreads_inside_a_role_is_refused():
    _refused(_kernel(Roles([Role("producer", TID.lt(64), [Barrier()], loc="gemm.py:12"),
                            Role("consumer", TID.ge(64), [])])),
             "role 'producer'", "gemm.py:12", "__syncthreads")


def test_collective_role_must_hold_whole_warpgroups():
    # setmaxnreg and wgmma are warpgroup-collective: a role splitting warpgroup 0 would
    # hang or compute garbage on the GPU.
    _refused(_kernel(Roles([Role("consumer", TID.lt(64), [], max_registers=232, loc="k.py:7"),
                            Role("producer", TID.ge(64), [])]), threads=256),
             "role 'consumer'", "k.py:7", "64 of the 128 threads of warpgroup 0")
    d = [Reg(ACC, Const(i)) for i in range(32)]
    wgmma_role = Roles([Role("p", TID.lt(128), []),
                        Role("c", TID.ge(0), [WgmmaFence(), Wgmma(WGMMA, d, DESC, DESC,
                                                                  Const(1))])])
    _refused(_kernel(wgmma_role, threads=192), "role 'c'", "64 of the 128 threads of "
             "warpgroup 1")
    # Whole warpgroups, and a non-collective role split any way, are fine.
    emit_cuda(_kernel(Roles([Role("a", (TID // 128).eq(1), [], max_registers=232),
                             Role("b", TID.lt(32), []), Role("c", TID.ge(0), [])]),
                      threads=256))


def test_mbarrier_errors():
    _refused(_kernel(MBarrierArrive("bar", Const(2))), "bar[2]", "2 barriers")
    _refused(_kernel(MBarrierArrive("nope", Const(0))), "'nope'", "mbarriers")
    _refused(_kernel(MBarrierInit("bar", Const(0), 0)), "arrival count 0")
    _refused(_kernel(MBarrierArrive("bar", Const(0), tx_bytes=1 << 20)), "expect-tx")
    kernel = _kernel()
    kernel.mbarriers = [MBarrierArray("bar", 1, 8196)]
    kernel.body = [MBarrierArrive("bar", Const(0))]
    _refused(kernel, "8196", "8-byte aligned")
    kernel.mbarriers = [MBarrierArray("bar", 2, 8184)]  # its first barrier is the tile's end
    _refused(kernel, "bar (bytes 8184..8199) overlaps shared buffer tile (bytes 0..8191)")


def test_tma_errors():
    _refused(_kernel(TmaLoad("tile", Const(0), "y_map", COORDS, "bar", Const(0))),
             "'y_map'", "TensorMapParam")
    _refused(_kernel(TmaLoad("tile", Const(0), "x_map", [Const(0)], "bar", Const(0))),
             "1 coordinates", "rank-2")
    # Multicast to CTAs the cluster does not have (a 1x1x1 cluster has only CTA 0).
    _refused(_kernel(TmaLoad("tile", Const(0), "x_map", COORDS, "bar", Const(0),
                             multicast=3)), "multicast mask 0x3", "(1, 1, 1)")
    # A box landing off its 1024-byte swizzle atom would be read back permuted.
    _refused(_kernel(TmaStore("x_map", COORDS, "tile", Const(64))), "TmaStore", "aligned")
    misaligned = _kernel(TmaLoad("tile", Const(0), "x_map", COORDS, "bar", Const(0)))
    misaligned.shared = [SharedBuffer("tile", f16, 64 * 64, 512)]
    _refused(misaligned, "tile", "starts at byte 512", "1024")


def test_wgmma_errors():
    d = [Reg(ACC, Const(i)) for i in range(32)]
    _refused(_kernel(Wgmma(WGMMA, d[:16], DESC, DESC, Const(1))), "16 accumulator", "32")
    wrong = RegArray("acc16", f16, 32)
    _refused(_kernel(Wgmma(WGMMA, [Reg(wrong, Const(i)) for i in range(32)], DESC, DESC,
                           Const(1))), "acc16", "f16", "f32")
    _refused(_kernel(Wgmma(WGMMA, d, DESC, DESC, Const(1)), threads=96), "96 threads",
             "warpgroups of 128")
    _refused(_kernel(Wgmma("wgmma.m64n65k16.f32.f16.f16", d, DESC, DESC, Const(1))),
             "m64n65k16")
    off_line = SmemDesc("tile", Const(64), 16, 1024, 128)  # byte 128: the second line
    _refused(_kernel(Wgmma(WGMMA, d, off_line, DESC, Const(1))), "first 128-byte line")
    bad_field = SmemDesc("tile", Const(0), 8, 1024, 128)
    _refused(_kernel(Wgmma(WGMMA, d, bad_field, DESC, Const(1))), "leading byte offset")


def test_group_wait_counts_out_of_range():
    _refused(_kernel(BulkWait(64)), "BulkWait", "0..63")
    _refused(_kernel(WgmmaWait(8)), "WgmmaWait", "0..7")


def test_thread_group_errors():
    _refused(_kernel(NamedBarrier(0, 128)), "id 0")
    _refused(_kernel(NamedBarrier(1, 48)), "48 threads")
    _refused(_kernel(Roles([Role("r", TID.lt(128), [], max_registers=100)])), "role 'r'",
             "100")
    _refused(_kernel(Roles([])), "no role")


def test_accumulators_are_fenced_around_wgmma_waits_and_fences():
    """The C compiler must not move accumulator accesses across wgmma.wait_group (which
    names no register) or writes below wgmma.fence: an empty asm reads and writes every
    accumulator register right after each wait and right before each fence."""
    source = emit_cuda(warp_specialized_gemm(), "sm_90a")
    lines = [line.strip() for line in source.splitlines()]
    fence = 'asm volatile("" : ' + ", ".join(f'"+f"(acc[{i}])' for i in range(32)) \
        + ' :: "memory");'
    waits = [i for i, line in enumerate(lines) if "wgmma.wait_group" in line]
    fences = [i for i, line in enumerate(lines) if "wgmma.fence.sync" in line]
    assert waits and fences
    assert all(lines[i + 2] == fence for i in waits)      # after the comment line
    assert all(lines[i - 1] == fence for i in fences)


@needs_compiler
def test_readme_gemm_lowered_for_sm90a_compiles_to_hgmma_and_tma():
    """The design-sketch GEMM through synthesis and the Hopper lowering: its thread IR
    prints and compiles, wgmma and TMA in the SASS, accumulators in registers."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from examples.gemm import gemm as readme_gemm
    from tegula.build import build
    kernel = build(readme_gemm, dict(BM=64, BN=64), None, "sm_90a").thread_kernel
    sass = _sass(kernel)
    assert "HGMMA.64x64x16.F32" in sass and "UTMALDG.2D" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass)
