"""`lower/wgmma_waits.py`: a pipeline body's `wgmma.wait_group 0` moves past the register
arithmetic that follows its gemm and touches none of the wgmma's registers — so the
multiply-adds of a previous K block's product run while the tensor cores compute this one —
and no further: not past a statement that touches the accumulator, nor past memory
accesses, barriers or branches. The emulator, which keeps a wgmma's registers busy until
its wait, checks the kernels that now run with the later wait, and reports a wait moved
too far."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build
from tegula.dtypes import f16
from tegula.emulate import EmulationError
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait
from tegula.lower.thread_ir import (Assign, Barrier, Comment, Const, For, RegArray, Reg,
                                    RegRead, Shuffle, Var, walk)
from tegula.lower.wgmma_waits import defer_wgmma_waits, register_arrays

ACC, OTHER, SCALE = (RegArray(name, f32, 4) for name in ("acc", "other", "scale"))


def _wgmma(d=ACC):
    return Wgmma("wgmma.m64n8k16.f32.f16.f16", [Reg(d, Const(i)) for i in range(4)],
                 None, None, scale_d=Const(1))


def _assign(dst, src):
    return Assign(Reg(dst, Const(0)), RegRead(Reg(src, Const(0))))


def test_register_arrays_finds_reads_and_writes():
    assert register_arrays(_assign(OTHER, SCALE)) == {"other", "scale"}
    assert register_arrays(_wgmma()) == {"acc"}


def test_the_wait_moves_past_independent_arithmetic_and_stops_at_the_accumulator():
    wait = WgmmaWait(0)
    body = [_wgmma(), WgmmaCommit(), wait, Comment("x"), _assign(OTHER, SCALE),
            _assign(OTHER, OTHER), _assign(SCALE, ACC), _assign(OTHER, SCALE)]
    out = defer_wgmma_waits(body)
    assert [type(s) for s in out[:2]] == [Wgmma, WgmmaCommit]
    assert out.index(wait) == 5 and out[6] is body[6]   # right before the read of acc
    assert [s for s in out if s is not out[5]] == [s for s in body if s is not wait]


def test_the_wait_moves_past_a_shuffle_of_other_registers_and_stops_at_one_of_the_acc():
    """A warp shuffle only moves registers between the warp's lanes (a row max of the
    softmax): the wait moves past one of other registers, not past one reading acc."""
    wait = WgmmaWait(0)
    other = Shuffle(Reg(OTHER, Const(1)), Reg(SCALE, Const(0)), "xor", Const(1))
    of_acc = Shuffle(Reg(OTHER, Const(1)), Reg(ACC, Const(0)), "xor", Const(1))
    body = [_wgmma(), WgmmaCommit(), wait, other, _assign(OTHER, SCALE), of_acc]
    out = defer_wgmma_waits(body)
    assert out.index(wait) == 4 and out[5] is of_acc


def _gemm(d=ACC):
    """A gemm as lowering writes it: fence, wgmma, commit, wait_group 0."""
    return [WgmmaFence(), _wgmma(d), WgmmaCommit(), WgmmaWait(0)]


def test_two_gemms_stay_in_flight_and_each_is_waited_for_at_its_first_use():
    """FlashAttention-3's order: s = q @ k.T, then acc += p @ v, then arithmetic reading
    s, then arithmetic reading acc. The first gemm's wait goes past the second gemm
    (which touches none of s): `wait_group 1` before the read of s keeps acc's wgmma in
    flight, `wait_group 0` comes before the read of acc."""
    body = _gemm(OTHER) + _gemm(ACC) + [_assign(SCALE, SCALE), _assign(SCALE, OTHER),
                                         _assign(SCALE, SCALE), _assign(SCALE, ACC)]
    out = defer_wgmma_waits(body)
    kinds = [type(s).__name__ + (str(s.pending) if isinstance(s, WgmmaWait) else "")
             for s in out]
    assert kinds == ["WgmmaFence", "Wgmma", "WgmmaCommit", "WgmmaFence", "Wgmma",
                     "WgmmaCommit", "Assign", "WgmmaWait1", "Assign", "Assign",
                     "WgmmaWait0", "Assign"]


def _kinds(out):
    return [type(s).__name__ + (str(s.pending) if isinstance(s, WgmmaWait) else "")
            for s in out]


def test_a_gemm_into_an_accumulator_in_flight_with_the_same_instruction_issues_at_once():
    """A second gemm into the first one's accumulator, by wgmmas of the same instruction
    on the same registers (PTX orders accumulator accesses of same-shape wgmmas by
    itself, `wgmma.fence`): no wait before its fence; both groups in flight up to the
    barrier, which retires every group before it."""
    out = defer_wgmma_waits(_gemm(ACC) + _gemm(ACC) + [Barrier()])
    assert _kinds(out) == ["WgmmaFence", "Wgmma", "WgmmaCommit", "WgmmaFence", "Wgmma",
                           "WgmmaCommit", "WgmmaWait0", "Barrier"]
    out = defer_wgmma_waits(_gemm(ACC) + _gemm(OTHER) + [_assign(SCALE, SCALE)])
    assert isinstance(out[-1], WgmmaWait) and out[-1].pending == 0  # the end pays too
    assert sum(isinstance(s, WgmmaWait) for s in out) == 1


def _shaped(instr, d, a=None):
    return [WgmmaFence(), Wgmma(instr, d, a, None, scale_d=Const(1)), WgmmaCommit(),
            WgmmaWait(0)]


N8 = "wgmma.m64n8k16.f32.f16.f16"
N16 = "wgmma.m64n16k16.f32.f16.f16"
WIDE = RegArray("wide", f32, 8)


@pytest.mark.parametrize("second", [
    _shaped(N16, [Reg(WIDE, Const(i)) for i in range(8)]),            # another shape
    _shaped(N8, [Reg(WIDE, Const(i)) for i in (1, 0, 2, 3)]),         # registers reordered
    _shaped(N8, [Reg(WIDE, Const(i)) for i in range(2, 6)]),          # overlapping, shifted
    _shaped(N8, [Reg(OTHER, Const(i)) for i in range(4)],             # A = the acc in flight
            [Reg(WIDE, Const(i)) for i in range(4)]),
    _shaped(N8, [Reg(WIDE, Const(i)) for i in range(4)],              # same d, A in flight
            [Reg(WIDE, Const(i)) for i in range(4)]),
    _shaped(N8, [Reg(WIDE, Var("i")) for i in range(4)]),             # index unknown
])
def test_a_gemm_sharing_registers_with_a_wgmma_in_flight_otherwise_waits_first(second):
    """Only the exact chain goes by: another instruction on the same registers, the
    same instruction on other positions of them, a register A operand that is the
    in-flight accumulator, or an index that is not a constant wait before the fence."""
    first = _shaped(N8, [Reg(WIDE, Const(i)) for i in range(4)])
    out = defer_wgmma_waits(first + second)
    assert _kinds(out)[:5] == ["WgmmaFence", "Wgmma", "WgmmaCommit", "WgmmaWait0",
                               "WgmmaFence"]


def test_a_gemm_into_disjoint_registers_of_the_same_array_issues_at_once():
    """The other half of a wide accumulator (disjoint registers of one array) is no
    hazard: the array is compared register by register."""
    first = _shaped(N8, [Reg(WIDE, Const(i)) for i in range(4)])
    second = _shaped(N8, [Reg(WIDE, Const(i)) for i in range(4, 8)])
    assert _kinds(defer_wgmma_waits(first + second))[:4] == [
        "WgmmaFence", "Wgmma", "WgmmaCommit", "WgmmaFence"]


@pytest.mark.parametrize("stop", [Barrier(), For(None, Const(0), Const(1), 1, [])])
def test_the_wait_stops_at_anything_but_register_arithmetic(stop):
    wait = WgmmaWait(0)
    body = [_wgmma(), WgmmaCommit(), wait, _assign(OTHER, SCALE), stop,
            _assign(OTHER, SCALE)]
    out = defer_wgmma_waits(body)
    assert out.index(wait) == 3 and out[4] is stop


def test_the_wait_moves_past_a_branch_of_register_arithmetic_only():
    """A branch on scalars whose sides only compute on other registers (the attention
    mask of the blocks past the diagonal) is passed like its statements; one touching acc,
    holding a barrier, or reading memory in its condition stops the wait."""
    from tegula.dtypes import i32
    from tegula.lower.thread_ir import If, LoadScalar, Var
    cond = Var("i0").lt(Const(3))
    free = If(cond, [_assign(OTHER, SCALE)])
    stops = [If(cond, [_assign(OTHER, ACC)]), If(cond, [_assign(OTHER, SCALE), Barrier()]),
             If(LoadScalar("offsets", (Const(0),), i32).lt(Const(3)), [_assign(OTHER, SCALE)])]
    for stop in stops:
        wait = WgmmaWait(0)
        out = defer_wgmma_waits([_wgmma(), WgmmaCommit(), wait, free, stop])
        assert out.index(wait) == 3 and out[4] is stop


def test_a_wait_with_nothing_in_flight_and_pending_waits_stay():
    first, keep = WgmmaWait(0), WgmmaWait(1)
    body = [first, _assign(OTHER, SCALE), _wgmma(), WgmmaCommit(), keep,
            _assign(OTHER, SCALE)]
    assert defer_wgmma_waits(body) == body


def _statement_names(loop: For) -> list[str]:
    return [type(s).__name__ for s in loop.body]


def test_a_lagged_promotion_runs_while_the_wgmmas_do():
    """`acc += prev` (the previous K block's product) touches none of this block's wgmma
    registers: the wait comes after it, before `prev = part` reads them."""
    kernel = build(_reads_too_early, dict(BM=64, BN=64, BK=32), None,
                   "sm_90a").thread_kernel
    loop, = [s for s in walk(kernel.body)
             if isinstance(s, For) and any(isinstance(x, WgmmaCommit) for x in s.body)]
    names = _statement_names(loop)
    between = names[names.index("WgmmaCommit") + 1:names.index("WgmmaWait")]
    # 64x64 f32 over 128 threads: 32 values a thread, one add each
    assert between.count("Assign") == 32


@tg.kernel(threads=128, warp_specialize=True)
def _reads_too_early(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                     BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32):
    ga = a.tile((BM, BK), (0, None))
    gb = b.tile((BN, BK), (0, None))
    acc = tg.zeros((BM, BN), f32)
    prev = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=2)
    sb = tg.shared((BN, BK), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        acc += prev
        prev = part
    tg.copy(acc + prev, c.tile((BM, BN), (0, 0)))


def test_the_lagged_sum_is_right_and_a_wait_moved_too_far_is_reported(monkeypatch):
    rng = np.random.default_rng(0)
    a, b = random_input(rng, (64, 96), f16), random_input(rng, (64, 96), f16)
    c = poisoned((64, 64), f32)
    tg.emulate(_reads_too_early, (1,), a, b, c, target="sm_90a")
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.allclose(c, ref, rtol=1e-5, atol=1e-3)

    # A deferral that ignores the accumulator (moves every wait past all arithmetic)
    # lets `prev = part` read registers a wgmma still owns: the emulator says so.
    import tegula.lower.hopper as hopper
    from tegula.lower import wgmma_waits

    def too_far(stmts):
        waits = [s for s in stmts if isinstance(s, WgmmaWait)]
        rest = [s for s in stmts if not isinstance(s, WgmmaWait)]
        return rest + waits
    monkeypatch.setattr(hopper, "defer_wgmma_waits", too_far)
    monkeypatch.setattr(wgmma_waits, "defer_wgmma_waits", too_far)
    with pytest.raises(EmulationError, match="still in flight"):  # BK=16: a fresh build
        tg.emulate(_reads_too_early, (1,), a, b, poisoned((64, 64), f32), target="sm_90a",
                   BK=16)


# ------------------------------------------------------------ the consumer's end barrier

def _loop_of(kernel, constexprs):
    body = build(kernel, constexprs, None, "sm_90a").thread_kernel.body
    loop, = [s for s in walk(body)
             if isinstance(s, For) and any(isinstance(x, WgmmaCommit) for x in s.body)]
    return loop


def test_a_consumer_that_only_reads_the_stages_ends_its_iterations_without_a_barrier():
    """The blockwise FP8 body reads only the ring's stages (which only the producer's TMA
    writes, once every consumer released them): no named barrier keeps its two consumer
    warpgroups in lockstep."""
    from tegula.kernels.fp8 import fp8_blockwise_gemm_kernel
    from tegula.lower.async_ir import NamedBarrier
    from tegula.dtypes import bf16

    loop = _loop_of(fp8_blockwise_gemm_kernel(bf16), dict(BM=128, BN=128, STAGES=4,
                                                           threads=256))
    assert not any(isinstance(s, NamedBarrier) for s in loop.body)


@tg.kernel(threads=128, warp_specialize=True)
def _writes_shared(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                   BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32):
    ga = a.tile((BM, BK), (0, None))
    gb = b.tile((BN, BK), (0, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=2)
    sb = tg.shared((BN, BK), f16, stages=2)
    scratch = tg.shared((BM, BN), f32)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        tg.copy(part, scratch)                    # a consumer write: the barrier stays
        acc += tg.load(scratch)
    tg.copy(acc, c.tile((BM, BN), (0, 0)))


def test_a_consumer_that_writes_shared_memory_keeps_the_barrier_and_is_right():
    from tegula.lower.async_ir import NamedBarrier

    loop = _loop_of(_writes_shared, {})
    assert any(isinstance(s, NamedBarrier) for s in loop.body)
    rng = np.random.default_rng(1)
    a, b = random_input(rng, (64, 96), f16), random_input(rng, (64, 96), f16)
    c = poisoned((64, 64), f32)
    tg.emulate(_writes_shared, (1,), a, b, c, target="sm_90a", role_order="reversed")
    assert np.allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-3)


@tg.kernel(threads=256, warp_specialize=True)
def _reads_a_then_rewrites_it(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                              d: tg.Tensor[f16], BM: tg.constexpr = 128, BN: tg.constexpr = 64,
                              BK: tg.constexpr = 64):
    sa = tg.shared((BM, BK), f16)
    tg.copy(a.tile((BM, BK), (0, 0)), sa)
    gb = b.tile((BN, BK), (None, 0))
    sb = tg.shared((BN, BK), f16, stages=2)
    acc = tg.zeros((BM, BN), f32)
    for j in tg.pipeline(gb.shape[2], stages=2):
        tg.copy(gb[:, :, j], sb[j])
        s = tg.zeros((BM, BN), f32)
        tg.gemm(s, sa, sb[j])                     # reads sa, which the loop never writes
        acc += s
    tg.copy(acc, c.tile((BM, BN), (0, 0)))
    tg.copy(a.tile((BM, BK), (1, 0)), sa)         # after the loop: rewrites it
    tg.copy(tg.load(sa), d.tile((BM, BK), (0, 0)))


@pytest.mark.parametrize("role_order", ["listed", "reversed", "random:1"])
def test_a_buffer_only_read_in_the_loop_gets_one_barrier_after_it_not_one_per_iteration(
        role_order):
    """The attention forward's body reads q's tile, which nothing in the loop writes: its
    iterations end without a named barrier (which held the two consumer warpgroups in
    lockstep: 467 -> 505 TFLOP/s on an H100 without it), and one barrier after the loop
    orders the last reads before what follows may rewrite the buffer (here it does).
    (The emulator runs one role's warpgroups in lockstep, so it cannot show that race:
    the IR is checked.)"""
    from tegula.kernels.attention import attention_kernel
    from tegula.lower.async_ir import NamedBarrier
    from tegula.lower.async_ir import Roles

    for kernel, constexprs in ((_reads_a_then_rewrites_it, {}),
                               (attention_kernel(f16), dict(D=128, QK_SCALE=0.1, CAUSAL=True,
                                                           BM=128, BN=128, threads=256))):
        body = build(kernel, constexprs, None, "sm_90a").thread_kernel.body
        roles = next(s for s in walk(body) if isinstance(s, Roles)).roles
        consumer = next(r.body for r in roles if r.name == "consumer")
        loop = next(i for i, s in enumerate(consumer) if isinstance(s, For)
                    and any(isinstance(x, WgmmaCommit) for x in s.body))
        assert not any(isinstance(s, NamedBarrier) for s in consumer[loop].body)
        # (the carried groups' wait_group 0, a proxy fence first)
        assert any(isinstance(s, NamedBarrier) for s in consumer[loop + 1:loop + 4])
    rng = np.random.default_rng(2)
    a, b = random_input(rng, (256, 64), f16), random_input(rng, (200, 64), f16)
    c, d = poisoned((128, 64), f32), poisoned((128, 64), f16)
    tg.emulate(_reads_a_then_rewrites_it, (1,), a, b, c, d, target="sm_90a",
               role_order=role_order)
    blocks = np.zeros((128, 256))
    blocks[:, :200] = a[:128].astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, blocks.reshape(128, 4, 64).sum(axis=1), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(d, a[128:])


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_two_consumer_warpgroups_without_the_barrier_stay_right(role_order):
    """Blockwise FP8 on two consumer warpgroups (BM = 128, threads = 256), which now drift
    apart within the ring: every element against numpy, either role first."""
    from tegula.dtypes import bf16, f8e4m3
    from tegula.emulate.values import round_to
    from tegula.kernels.fp8 import matmul_fp8_emulated, scale_shapes

    m, n, k = 130, 64, 384
    rng = np.random.default_rng(5)
    a, b = (round_to(rng.standard_normal(s).astype(np.float32) * 4, f8e4m3).astype(np.float32)
            for s in ((m, k), (n, k)))
    shape_a, shape_b = scale_shapes(m, n, k, True)
    sa = (10.0 ** rng.uniform(-1, 1, shape_a)).astype(np.float32)
    sb = (10.0 ** rng.uniform(-1, 1, shape_b)).astype(np.float32)
    c = matmul_fp8_emulated(a, b, sa, sb, bf16, block_scales=True, BM=128, BN=64, STAGES=2,
                            threads=256, role_order=role_order)
    a_scaled = a * np.repeat(sa.astype(np.float64), 128, axis=1)
    b_scaled = b * np.repeat(np.repeat(sb.astype(np.float64), 128, axis=0), 128, axis=1)[:n]
    ref = a_scaled @ b_scaled.T
    magnitude = np.abs(a_scaled) @ np.abs(b_scaled).T
    assert not np.isnan(c).any()
    assert (np.abs(c - ref) <= (k + 8) * 2.0 ** -24 * magnitude + 2.0 ** -8 * np.abs(ref)).all()


# ------------------------------------------------ the attention forward's overlapped loop

def test_an_overlapped_attention_loop_with_a_wait_short_by_one_group_is_reported(monkeypatch):
    """The overlapped forward (two gemms in flight during the softmax) is right in the
    emulator with the waits placed here; with every wait_group leaving one group more in
    flight than it may (an off-by-one in the count), the softmax reads the scores of a
    wgmma still running, and the emulator says so."""
    from tegula.kernels.attention import attention_emulated
    import tegula.lower.hopper as hopper
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, n, 64)).astype(np.float16) for n in (70, 150, 150))
    # warp-specialized (the cost model keeps a 64-row forward in one role by default)
    o = attention_emulated(q, k, v, True, 0.11, target="sm_90a", OVERLAP=True,
                           warp_specialize=True)
    s = np.where(np.arange(150)[None, :] <= np.arange(70)[:, None] + 80,
                 q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64) * 0.11, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = p @ v[0, 0].astype(np.float64) / p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(o[0, 0].astype(np.float64), want, rtol=2e-3, atol=2e-3)

    real, real_carry = hopper.defer_wgmma_waits, hopper.carry_wgmma_groups

    def short(stmts):
        return [WgmmaWait(s.pending + 1) if isinstance(s, WgmmaWait) else s for s in stmts]

    def carried_short(stmts, **limits):
        found = real_carry(stmts, **limits)
        return None if found is None else (short(found[0]), found[1])
    monkeypatch.setattr(hopper, "defer_wgmma_waits", lambda stmts: short(real(stmts)))
    monkeypatch.setattr(hopper, "carry_wgmma_groups", carried_short)
    with pytest.raises(EmulationError, match="still in flight"):   # scale: a fresh build
        attention_emulated(q, k, v, True, 0.12, target="sm_90a", OVERLAP=True,
                           warp_specialize=True)


def test_a_product_tile_refilled_for_a_second_gemm_gets_the_stage_wait_repeated():
    """`split_reused_products`: a product tile that a gemm wrote and a promotion read,
    then filled again for the body's second gemm (the blockwise FP8 kernel's row halves),
    gets the stage's wait repeated before the fill (ptxas would otherwise issue the second
    gemm first, into other registers); a body whose tile is filled only before its one
    gemm, or whose reads write back into the product itself, or with another gemm's wgmmas
    in flight at the refill, gets none."""
    from tegula.lower.async_ir import MBarrierWait
    from tegula.lower.wgmma_waits import split_reused_products
    stage = MBarrierWait("full", Const(0), Const(1))
    fill = Assign(Reg(ACC, Const(0)), Const(0.0))
    gemm = [WgmmaFence(), _wgmma(), WgmmaCommit(), WgmmaWait(0)]
    halves = [fill, *gemm, _assign(OTHER, ACC), fill, *gemm, _assign(OTHER, ACC)]
    out = split_reused_products(halves, stage)
    repeats = [i for i, s in enumerate(out) if isinstance(s, MBarrierWait)]
    assert len(repeats) == 1 and out[repeats[0] + 1] is fill and repeats[0] > 5
    assert out[repeats[0]].repeat and not stage.repeat
    assert out[:repeats[0]] + out[repeats[0] + 1:] == halves
    one = [fill, *gemm, _assign(OTHER, ACC), _assign(SCALE, OTHER)]
    in_place = [fill, *gemm, _assign(ACC, ACC), _assign(OTHER, ACC)]
    assert split_reused_products(one, stage) == one
    assert split_reused_products(in_place, stage) == in_place
    # Another product's wgmmas in flight at the refill: no repeat (ptxas would retire them
    # before the repeat's branch).
    other_gemm = [WgmmaFence(), _wgmma(OTHER), WgmmaCommit()]
    overlapped = [fill, *gemm, *other_gemm, _assign(SCALE, ACC), fill, *gemm]
    assert split_reused_products(overlapped, stage) == overlapped


# ------------------------------------------ two gemms an iteration into one accumulator

@tg.kernel(threads=128)
def two_steps_an_iteration(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                           BM: tg.constexpr = 64, BN: tg.constexpr = 128,
                           BK: tg.constexpr = 64):
    """c = a @ b.T, two k-steps an iteration into one accumulator (the second gemm is
    issued while the first one's wgmmas run). Also the GPU test's kernel
    (tests/gpu/test_wgmma_carry_gpu.py)."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((BM, BK), (m, None)), b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa, sa2 = tg.shared((BM, BK), f16, stages=2), tg.shared((BM, BK), f16, stages=2)
    sb, sb2 = tg.shared((BN, BK), f16, stages=2), tg.shared((BN, BK), f16, stages=2)
    for k in tg.pipeline((ga.shape[2] + 1) // 2, stages=2):
        tg.copy(ga[:, :, 2 * k], sa[k])
        tg.copy(gb[:, :, 2 * k], sb[k])
        tg.copy(ga[:, :, 2 * k + 1], sa2[k])
        tg.copy(gb[:, :, 2 * k + 1], sb2[k])
        tg.gemm(acc, sa[k], sb[k])
        tg.gemm(acc, sa2[k], sb2[k])
    tg.copy(acc, c.tile((BM, BN), (m, n)))


def test_two_gemms_an_iteration_into_one_accumulator_chain_and_are_right():
    """The consumer's body issues step 2k + 1's wgmmas right after step 2k's (no
    wait_group between the two gemms: same instruction, same accumulator registers), the
    two groups run on into the next iteration (`carry_wgmma_groups`), which retires them
    at its end (wait_group 2: its own two stay in flight), and the sum is right in the
    emulator (which keeps the accumulator busy until the wait that retires it) at a K
    of 7 k-steps (the last pair half past K: TMA fills zeros)."""
    tiles = dict(BN=64, BK=32, warp_specialize=True)
    loop = _loop_of(two_steps_an_iteration, tiles)
    kinds = [k for k in _kinds(loop.body) if k.startswith("Wgmma")]
    assert kinds == ["WgmmaFence"] + ["Wgmma"] * 2 + ["WgmmaCommit", "WgmmaFence"] + \
        ["Wgmma"] * 2 + ["WgmmaCommit", "WgmmaWait2"], kinds
    rng = np.random.default_rng(7)
    a, b = random_input(rng, (64, 224), f16), random_input(rng, (64, 224), f16)
    c = poisoned((64, 64), f32)
    tg.emulate(two_steps_an_iteration, (1, 1), a, b, c, target="sm_90a", **tiles)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T,
                               rtol=1e-5, atol=1e-3)


# ------------------------------------------------- memory statements between a gemm and its use

def _reading(buffer):
    """A gemm whose wgmma reads A and B from shared buffer `buffer`."""
    from tegula.lower.async_ir import SmemDesc
    desc = SmemDesc(buffer, Const(0), 16, 128, 128)
    return [WgmmaFence(), Wgmma("wgmma.m64n8k16.f32.f16.f16", [Reg(ACC, Const(i))
                                                              for i in range(4)],
                                desc, desc, scale_d=Const(1)), WgmmaCommit(), WgmmaWait(0)]


def test_global_accesses_and_stores_to_other_buffers_go_by_a_gemm_in_flight():
    """wgmmas read registers and shared memory only: a global store of other registers, a
    shared load, a proxy fence and a shared store into a buffer no in-flight wgmma reads
    go by; a shared store into the buffer it reads, or a global store of its accumulator,
    waits first; a barrier pays every debt."""
    from tegula.lower.async_ir import FenceProxyAsync
    from tegula.lower.thread_ir import GlobalStore, SharedLoad, SharedStore
    other = Reg(OTHER, Const(0))
    passing = [GlobalStore("c", Const(0), other, 1), SharedLoad(other, "sa", Const(0), 1),
               FenceProxyAsync(), SharedStore("staging", Const(0), other, 1)]
    for stmt in passing:
        out = defer_wgmma_waits(_reading("sa") + [stmt])
        assert _kinds(out)[3:] == [type(stmt).__name__, "WgmmaWait0"], stmt
    for stop in (SharedStore("sa", Const(0), other, 1),
                 GlobalStore("c", Const(0), Reg(ACC, Const(2)), 1), Barrier()):
        out = defer_wgmma_waits(_reading("sa") + [stop])
        assert _kinds(out)[3:] == ["WgmmaWait0", type(stop).__name__], stop


@tg.kernel(threads=128, warp_specialize=True)
def _stores_the_previous_product(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                                 BM: tg.constexpr = 64, BN: tg.constexpr = 64,
                                 BK: tg.constexpr = 32):
    """Each k-step's product stored to global memory (c's K-step slices) one step late:
    the store of product k-1 goes out while product k's wgmmas run."""
    ga = a.tile((BM, BK), (0, None))
    gb = b.tile((BN, BK), (0, None))
    prev = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=2)
    sb = tg.shared((BN, BK), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        tg.copy(prev, c.tile((BM, BN), (k, 0)))
        prev = part
    tg.copy(prev, c.tile((BM, BN), (ga.shape[2], 0)))


@pytest.mark.parametrize("role_order", ["listed", "stall"])
def test_a_global_store_runs_while_the_next_product_computes_and_is_right(role_order):
    loop = _loop_of(_stores_the_previous_product, {})
    kinds = _kinds(loop.body)
    assert kinds.index("WgmmaWait0") > kinds.index("GlobalStore") > kinds.index("WgmmaCommit")
    rng = np.random.default_rng(9)
    a, b = random_input(rng, (64, 96), f16), random_input(rng, (64, 96), f16)
    c = poisoned((64 * 4, 64), f32)
    tg.emulate(_stores_the_previous_product, (1,), a, b, c, target="sm_90a",
               role_order=role_order)
    steps = [a[:, 32 * j:32 * j + 32].astype(np.float64) @ b[:, 32 * j:32 * j + 32].T
             .astype(np.float64) for j in range(3)]
    np.testing.assert_allclose(c, np.concatenate([np.zeros((64, 64))] + steps), rtol=1e-5,
                               atol=1e-3)
