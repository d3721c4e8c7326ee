"""The consumer schedule stated in the source: `with tg.consumer(schedule="pingpong"):`
(or "cooperative") compiles to the same CUDA as the `consumers=` build option gives the
same kernel, is right in the emulator under every role order (bit-identical to the
option's build), and misuse is an error at the block's line: an unknown schedule, a
block and an option that disagree, ping-pong where it cannot run."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.errors import SynthesisError, TraceError
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.gemm import persistent_grid
from tegula.kernels.schedule import grouped_tile

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "emulate"))
sys.path.insert(0, os.path.join(HERE, "..", "lang"))
from async_kernels import run_with_deadline  # noqa: E402
from examples.attention import INF, LOG2E, attention_fwd  # noqa: E402
from examples.attention import reference as attention_reference  # noqa: E402
from examples.persistent_gemm import persistent_gemm  # noqa: E402
from source_lines import marked_line  # noqa: E402


@tg.kernel(threads=128)
def scheduled_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
                   BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 64,
                   STAGES: tg.constexpr = 4, GROUP: tg.constexpr = 8,
                   SCHEDULE: tg.constexpr = "pingpong"):
    """examples/persistent_gemm.py's loop with its roles and consumer schedule stated."""
    tiles_m, tiles_n = tg.cdiv(a.shape[0], BM), tg.cdiv(b.shape[0], BN)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for t in tg.range(tg.block_id(0), tiles_m * tiles_n, tg.num_programs(0)):
        m, n = grouped_tile(t, tiles_m, tiles_n, GROUP)
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):  # MARK-loop
            with tg.producer():
                tg.copy(ga[:, :, k], sa[k])
                tg.copy(gb[:, :, k], sb[k])
            with tg.consumer(schedule=SCHEDULE):  # MARK-consumer
                tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def code(kernel, **options) -> str:
    """sm_90a CUDA without what names the source (the kernel's name, comments)."""
    source = build(kernel, options, None, "sm_90a").cuda_source()
    source = re.sub(r"//[^\n]*", "", source).replace(kernel.name, "KERNEL")
    return "\n".join(line.rstrip() for line in source.splitlines())


@pytest.mark.parametrize("schedule", ["pingpong", "cooperative"])
@pytest.mark.parametrize("tiles", [dict(BM=128, BN=128, BK=64, STAGES=4),
                                   dict(BM=64, BN=64, BK=32, STAGES=3, GROUP=3)],
                         ids=["128x128x64", "64x64x32"])
def test_a_stated_schedule_compiles_to_the_build_options(schedule, tiles):
    stated = code(scheduled_gemm, SCHEDULE=schedule, **tiles)
    assert stated == code(persistent_gemm, consumers=schedule, **tiles)
    # The schedule took effect: ping-pong's turn barriers, 384 threads; cooperative 256.
    pingpong = "bar.arrive" in stated
    assert pingpong == (schedule == "pingpong")
    assert (f"__launch_bounds__({384 if pingpong else 256}" in stated)


def test_the_default_and_the_stated_schedule_meet_and_explain_says_where():
    """At one warpgroup's tile synthesis would pick ping-pong itself: stating it changes
    nothing but the note; stating cooperative overrides the default."""
    line = marked_line(__file__, "MARK-consumer")
    text = tg.explain(scheduled_gemm, target="sm_90a", SCHEDULE="cooperative")
    assert "consumers: cooperative (tg.consumer(schedule='cooperative') at line " \
        f"{line})" in text
    assert f"tg.consumer(schedule='cooperative') at line {line}" in text
    text = tg.explain(scheduled_gemm, target="sm_90a", SCHEDULE="pingpong")
    assert f"consumers: pingpong (tg.consumer(schedule='pingpong') at line {line})" in text


ORDERS = ["listed", "reversed", "random:4", "random:9"]


@pytest.mark.parametrize("role_order", ORDERS)
@pytest.mark.parametrize("schedule", ["pingpong", "cooperative"])
def test_a_stated_schedule_is_right_under_every_role_order(schedule, role_order):
    """97 x 130 x 200 on 64 x 32 tiles: 10 tiles on 5 blocks, ragged M, N and K; every
    element against numpy and the bits of the build option's kernel."""
    m, n, k, sms = 97, 130, 200, 5
    tiles = dict(BM=64, BN=32, BK=32, STAGES=3, GROUP=3)
    grid = persistent_grid(m, n, sms, 64, 32)
    rng = np.random.default_rng(7)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    outputs = []
    for kernel, options in [(scheduled_gemm, dict(SCHEDULE=schedule)),
                            (persistent_gemm, dict(consumers=schedule))]:
        c = poisoned((m, n), f16)
        report = run_with_deadline(lambda: tg.emulate(
            kernel, grid, a, b, c, target="sm_90a", role_order=role_order, num_sms=sms,
            **tiles, **options))
        assert report.threads == (384 if schedule == "pingpong" else 256)
        outputs.append(c)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    ref = af @ bf.T
    bound = 2.0 ** -10 * np.abs(ref) + k * 2.0 ** -23 * (np.abs(af) @ np.abs(bf).T)
    assert not np.isnan(outputs[0]).any()
    assert np.all(np.abs(outputs[0].astype(np.float64) - ref) <= bound)
    assert np.array_equal(outputs[0].view(np.uint16), outputs[1].view(np.uint16))


# ------------------------------------------------------------------ misuse


def test_an_unknown_schedule_is_refused_at_trace_time():
    with pytest.raises(TraceError, match="schedule='zigzag'.*'cooperative', 'pingpong'"):
        build(scheduled_gemm, dict(SCHEDULE="zigzag"), None, "sm_90a")


def test_the_language_and_synthesis_know_the_same_schedules():
    from tegula.lang.roles import CONSUMER_SCHEDULES as stated
    from tegula.synth.roles import CONSUMER_SCHEDULES as options
    assert set(stated) == set(options) - {None}


def test_a_block_and_an_option_that_disagree_are_refused_at_the_block():
    with pytest.raises(SynthesisError, match="disagree") as info:
        build(scheduled_gemm, dict(SCHEDULE="pingpong", consumers="cooperative"), None,
              "sm_90a")
    assert info.value.loc.lineno == marked_line(__file__, "MARK-consumer")
    # Agreeing is fine.
    build(scheduled_gemm, dict(SCHEDULE="pingpong", consumers="pingpong"), None, "sm_90a")


def test_pingpong_where_it_cannot_run_is_refused_at_the_block():
    """128x256 tiles span two warpgroups in a tile loop: no ping-pong of whole tiles."""
    with pytest.raises(SynthesisError) as info:
        build(scheduled_gemm, dict(BM=128, BN=256, threads=256), None, "sm_90a")
    err = info.value
    assert err.loc.lineno == marked_line(__file__, "MARK-consumer")
    assert "tg.consumer(schedule='pingpong')" in err.message
    assert "each ping-pong consumer is one warpgroup" in err.message
    assert "internal" not in err.message


# ------------------------------------------------------------------ turns inside the loop


@tg.kernel(threads=128)
def stated_attention(q: tg.Tensor[f16, 4], k: tg.Tensor[f16, 4], v: tg.Tensor[f16, 4],
        o: tg.Tensor[f16, 4], lse: tg.Tensor[f32, 3],
        D: tg.constexpr = 64, QK_SCALE: tg.constexpr = LOG2E / 8,
        CAUSAL: tg.constexpr = False, BM: tg.constexpr = 64,
        BN: tg.constexpr = 64, STAGES: tg.constexpr = 2, SCHEDULE: tg.constexpr = None):
    """examples/attention.py (not causal) with its pipeline body in role blocks."""
    m, h, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
    kv_head = h // (q.shape[1] // k.shape[1])
    seq_q, seq_k = q.shape[2], k.shape[2]
    sq = tg.shared((BM, D), f16)
    tg.copy(q[b, h].tile((BM, D), (m, 0)), sq)
    keys = k[b, kv_head].tile((BN, D), (None, 0))
    values = v[b, kv_head].tile((BN, D), (None, 0))
    sk = tg.shared((BN, D), f16, stages=STAGES)
    sv = tg.shared((BN, D), f16, stages=STAGES)
    rows = tg.arange(BM, offset=m * BM)
    m_i = tg.full((BM, 1), -INF, f32)
    l_i = tg.zeros((BM, 1), f32)
    acc = tg.zeros((BM, D), f32)
    blocks = tg.cdiv(seq_k, BN)
    for j in tg.pipeline(blocks, stages=STAGES):
        with tg.producer():
            tg.copy(keys[:, :, j], sk[j])
            tg.copy(values[:, :, j], sv[j])
        with tg.consumer(schedule=SCHEDULE):
            s = tg.zeros((BM, BN), f32)
            tg.gemm(s, sq, sk[j])
            cols = tg.arange(BN, offset=j * BN)
            visible = cols[None, :] < seq_k
            s = tg.where(visible, s * QK_SCALE, -INF)
            m_new = tg.maximum(m_i, tg.max(s, 1))
            m_base = tg.where(m_new == -INF, 0.0, m_new)
            p = tg.exp2(s - m_base)
            alpha = tg.exp2(m_i - m_base)
            l_i = l_i * alpha + tg.sum(p, 1)
            acc *= alpha
            tg.gemm(acc, p.to(f16), sv[j].T)
            m_i = m_new
    unseen = l_i == 0.0
    l_safe = tg.where(unseen, 1.0, l_i)
    tg.copy((acc * (1.0 / l_safe)).to(f16), o[b, h].tile((BM, D), (m, 0)))
    row_lse = tg.where(unseen, -INF, (m_i + tg.log2(l_safe)) * (1.0 / LOG2E))
    tg.copy(row_lse[:, 0], lse[b, h].tile((BM,), (m,)))


def test_a_stated_schedule_takes_turns_inside_an_attention_loop():
    """A two-warpgroup tile with no tile loop: ping-pong is FlashAttention-3's turns at the
    gemms inside the loop, the same CUDA as consumers='pingpong' on examples/attention.py,
    and the same bits in the emulator under a random role order."""
    stated = code(stated_attention, BM=128, threads=256, SCHEDULE="pingpong")
    assert "bar.arrive" in stated
    assert stated == code(attention_fwd, BM=128, threads=256, consumers="pingpong")
    rng = np.random.default_rng(5)
    q = random_input(rng, (1, 2, 130, 64), f16)
    k, v = random_input(rng, (1, 2, 100, 64), f16), random_input(rng, (1, 2, 100, 64), f16)
    outputs = []
    for kernel, options in [(stated_attention, dict(SCHEDULE="pingpong")),
                            (attention_fwd, dict(consumers="pingpong"))]:
        o, lse = poisoned((1, 2, 130, 64), f16), poisoned((1, 2, 130), f32)
        run_with_deadline(lambda: tg.emulate(kernel, (2, 2, 1), q, k, v, o, lse,
                                             target="sm_90a", role_order="random:2", BM=128,
                                             threads=256, **options))
        outputs.append((o, lse))
    assert not np.isnan(outputs[0][0]).any()
    assert np.array_equal(outputs[0][0].view(np.uint16), outputs[1][0].view(np.uint16))
    assert np.array_equal(outputs[0][1], outputs[1][1])
    ref = attention_reference(q, k, v, causal=False)[0]
    assert np.allclose(outputs[0][0].astype(np.float64), ref, atol=2e-3, rtol=1e-2)
