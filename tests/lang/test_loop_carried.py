"""Loop state written the way Triton and JAX users write it: a register tile defined before
a `tg.range` / `tg.pipeline` and rebound with `=` inside it is carried to the next
iteration, and holds the last iteration's value after the loop (emulator against numpy on
random data, every element checked; ragged shapes, tiles smaller than the thread count)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32

INF = float("inf")


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    """Random non-zero f32 data (no element is 0, so a dropped update shows)."""
    x = np.random.default_rng(seed).uniform(0.25, 1.0, shape)
    return (x * np.random.default_rng(seed + 1).choice([-1.0, 1.0], shape)).astype(np.float32)


def poisoned(*shape: int) -> np.ndarray:
    """An output no kernel wrote yet: NaN everywhere, so an unwritten element fails."""
    return np.full(shape, np.nan, np.float32)


def chunks(x: np.ndarray, bn: int, fill: float = 0.0) -> list[np.ndarray]:
    """The column chunks of `x` a kernel tiling it by `bn` sees (the last one padded)."""
    n = x.shape[1]
    padded = np.full((x.shape[0], -(-n // bn) * bn), fill, np.float64)
    padded[:, :n] = x
    return [padded[:, j:j + bn] for j in range(0, padded.shape[1], bn)]


# -- accumulation: acc = acc + x, acc = acc * alpha + x, run = max(run, max(t)) ----------
@tg.kernel(threads=64)
def chunk_sum(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
              BN: tg.constexpr = 16):
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.zeros((BM, BN), f32)
    for k in tg.range(xs.shape[2]):
        acc = acc + tg.load(xs[:, :, k])
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def chunk_axpy(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
               BN: tg.constexpr = 16, ALPHA: tg.constexpr = 0.75):
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.full((BM, BN), 0.5, f32)
    for k in tg.range(xs.shape[2]):
        acc = acc * ALPHA + tg.load(xs[:, :, k])
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def running_max(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
                BN: tg.constexpr = 16):
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    run = tg.full((BM, 1), -INF, f32)
    for k in tg.range(xs.shape[2]):
        run = tg.maximum(run, tg.max(tg.load(xs[:, :, k], fill=-INF), 1))
    tg.copy(run, y.tile((BM, 1), (m, 0)))


SHAPES = [  # (M, N, BM, BN, threads): ragged edges; a 4x8 tile over 64 threads; 96 threads
    (13, 70, 8, 16, 64), (5, 9, 4, 8, 64), (33, 100, 16, 32, 96)]


@pytest.mark.parametrize("M,N,BM,BN,threads", SHAPES)
def test_acc_plus_equals_numpy(M, N, BM, BN, threads):
    x, y = rand(M, N), poisoned(M, BN)
    tg.emulate(chunk_sum, (tg.cdiv(M, BM),), x, y, BM=BM, BN=BN, threads=threads)
    np.testing.assert_allclose(y, sum(chunks(x, BN)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M,N,BM,BN,threads", SHAPES)
def test_acc_times_alpha_plus_b_equals_numpy(M, N, BM, BN, threads):
    x, y = rand(M, N, seed=3), poisoned(M, BN)
    tg.emulate(chunk_axpy, (tg.cdiv(M, BM),), x, y, BM=BM, BN=BN, threads=threads)
    want = np.full((M, BN), 0.5)
    for part in chunks(x, BN):
        want = want * 0.75 + part
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M,N,BM,BN", [(13, 70, 8, 16), (6, 40, 4, 8)])
def test_running_max_equals_numpy(M, N, BM, BN):
    x, y = rand(M, N, seed=5), poisoned(M, 1)
    tg.emulate(running_max, (tg.cdiv(M, BM),), x, y, BM=BM, BN=BN)
    np.testing.assert_array_equal(y[:, 0], x.max(axis=1))


# -- online softmax, written as a Triton user writes it --------------------------------------
@tg.kernel(threads=64)
def softmax_weighted_sum(s: tg.Tensor[f32], v: tg.Tensor[f32], out: tg.Tensor[f32],
                         BM: tg.constexpr = 4, BN: tg.constexpr = 32):
    """Per row: sum_j softmax(s)_j * v_j, the row max and the softmax denominator."""
    m = tg.block_id(0)
    ss, vs = s.tile((BM, BN), (m, None)), v.tile((BM, BN), (m, None))
    m_i = tg.full((BM, 1), -INF, f32)
    l_i = tg.zeros((BM, 1), f32)
    acc = tg.zeros((BM, 1), f32)
    for k in tg.range(ss.shape[2]):
        t = tg.load(ss[:, :, k], fill=-INF)
        w = tg.load(vs[:, :, k])
        m_new = tg.maximum(m_i, tg.max(t, 1))
        alpha = tg.exp(m_i - m_new)
        p = tg.exp(t - m_new)
        l_i = l_i * alpha + tg.sum(p, 1)
        acc = acc * alpha + tg.sum(p * w, 1)
        m_i = m_new
    tg.copy(acc / l_i, out.tile((BM, 1), (m, 0)))
    tg.copy(m_i, out.tile((BM, 1), (m, 1)))
    tg.copy(l_i, out.tile((BM, 1), (m, 2)))


def softmax_reference(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    s64 = s.astype(np.float64)
    mx = s64.max(axis=1, keepdims=True)
    e = np.exp(s64 - mx)
    return np.concatenate([(e * v).sum(1, keepdims=True) / e.sum(1, keepdims=True), mx,
                           e.sum(1, keepdims=True)], axis=1)


@pytest.mark.parametrize("M,N,BM,BN", [(11, 75, 4, 32), (3, 200, 2, 16)])
def test_online_softmax_equals_numpy(M, N, BM, BN):
    s = rand(M, N, seed=7) * 4.0
    s[0, N - 1] = 9.0   # the row max arrives in the last, ragged chunk: rescaling must work
    v = rand(M, N, seed=9)
    out = poisoned(M, 3)
    with np.errstate(invalid="ignore"):   # rows past M compute -inf - -inf; never stored
        tg.emulate(softmax_weighted_sum, (tg.cdiv(M, BM),), s, v, out, BM=BM, BN=BN)
    np.testing.assert_allclose(out, softmax_reference(s, v), rtol=2e-5, atol=1e-6)


@tg.kernel(threads=128)
def attention(q: tg.Tensor[f16], k: tg.Tensor[f16], vt: tg.Tensor[f16], o: tg.Tensor[f32],
              BM: tg.constexpr = 16, BN: tg.constexpr = 32, D: tg.constexpr = 32):
    """o = softmax(q @ k.T) @ v, one BM-row block per program (flash-attention's loop)."""
    m = tg.block_id(0)
    sq = tg.shared((BM, D), f16)
    tg.copy(q.tile((BM, D), (m, 0)), sq)
    ks, vs = k.tile((BN, D), (None, 0)), vt.tile((D, BN), (0, None))
    sk, sv = tg.shared((BN, D), f16), tg.shared((D, BN), f16)
    m_i = tg.full((BM, 1), -INF, f32)
    l_i = tg.zeros((BM, 1), f32)
    acc = tg.zeros((BM, D), f32)
    for j in tg.range(ks.shape[2]):
        tg.copy(ks[:, :, j], sk)
        tg.copy(vs[:, :, j], sv)
        s = tg.zeros((BM, BN), f32)
        tg.gemm(s, sq, sk)
        m_new = tg.maximum(m_i, tg.max(s, 1))
        alpha = tg.exp(m_i - m_new)
        p = tg.exp(s - m_new)
        l_i = l_i * alpha + tg.sum(p, 1)
        acc = acc * alpha
        tg.gemm(acc, p.to(f16), sv)
        m_i = m_new
    tg.copy(acc / l_i, o.tile((BM, D), (m, 0)))


def attention_inputs(M: int, N: int, D: int):
    q = (rand(M, D, seed=11) * 0.5).astype(np.float16)
    k = (rand(N, D, seed=12) * 0.5).astype(np.float16)
    v = rand(N, D, seed=13).astype(np.float16)
    s = q.astype(np.float64) @ k.astype(np.float64).T
    e = np.exp(s - s.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    return q, k, np.ascontiguousarray(v.T), want


def test_online_softmax_attention_with_gemms_equals_numpy():
    M, N, D = 40, 96, 32      # M ragged against BM=16; three key blocks of 32
    q, k, vt, want = attention_inputs(M, N, D)
    o = poisoned(M, D)
    tg.emulate(attention, (tg.cdiv(M, 16),), q, k, vt, o)
    # p is rounded to f16 before the second gemm, as in every flash-attention kernel.
    np.testing.assert_allclose(o, want, rtol=1e-2, atol=2e-3)


def test_attention_cuda_compiles_for_sm_80_with_the_carried_state():
    from tegula.build import build
    from tegula.runtime.compiler import available_compilers, compile_cuda
    result = build(attention, target="sm_80")
    loop = next(op for op in result.traced.body if type(op).__name__ == "ForLoop")
    carried = [op for op in loop.body[-3:] if type(op).__name__ == "Copy"]
    assert len(carried) == 3   # l_i, acc and m_i flow to the next iteration
    source = result.cuda_source()
    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) to compile the generated source")
    assert compile_cuda(source, attention.name, "sm_80")


# -- zero-trip loops, nested loops, tg.pipeline, in-place updates mixed in --------------------
@tg.kernel(threads=64)
def stepped(x: tg.Tensor[f32], y: tg.Tensor[f32], start: int, stop: int,
            BM: tg.constexpr = 8, BN: tg.constexpr = 16):
    """acc over chunks start..stop-1 of x's row block (none when stop <= start)."""
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.load(xs[:, :, 0])
    for k in tg.range(start, stop):
        acc = acc * 0.5 + tg.load(xs[:, :, k])
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


@pytest.mark.parametrize("start,stop", [(1, 4), (2, 2), (3, 1), (0, 1)])
def test_zero_trip_loops_keep_the_value_from_before(start, stop):
    M, N, BM, BN = 13, 64, 8, 16
    x, y = rand(M, N, seed=21), poisoned(M, BN)
    tg.emulate(stepped, (tg.cdiv(M, BM),), x, y, start, stop)
    parts = chunks(x, BN)
    want = parts[0]
    for k in range(start, stop):
        want = want * 0.5 + parts[k]
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


@tg.kernel(threads=64)
def nested(x: tg.Tensor[f32], y: tg.Tensor[f32], outer: int, BM: tg.constexpr = 4,
           BN: tg.constexpr = 8, INNER: tg.constexpr = 3):
    """total = sum_i 0.5^(outer-1-i) * (sum_j 2 * chunk(i*INNER+j)): a carried tile made in
    the outer body (part), and an outer carried tile (total) rebound in both loops."""
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    total = tg.zeros((BM, BN), f32)
    for i in tg.range(outer):
        total = total * 0.5
        part = tg.zeros((BM, BN), f32)
        for j in tg.range(INNER):
            t = tg.load(xs[:, :, i * INNER + j])
            part = part + t
            total = total + t
        total = total + part
    tg.copy(total, y.tile((BM, BN), (m, 0)))


@pytest.mark.parametrize("outer", [0, 1, 3])
def test_nested_loops_carry_both_levels(outer):
    M, BM, BN, INNER = 6, 4, 8, 3
    x, y = rand(M, BN * INNER * 3, seed=31), poisoned(M, BN)
    tg.emulate(nested, (tg.cdiv(M, BM),), x, y, outer)
    parts = chunks(x, BN)
    want = np.zeros((M, BN))
    for i in range(outer):
        want = want * 0.5 + 2 * sum(parts[i * INNER:(i + 1) * INNER])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@tg.kernel(threads=128)
def decayed_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                 BM: tg.constexpr = 32, BN: tg.constexpr = 32, BK: tg.constexpr = 16,
                 STAGES: tg.constexpr = 3):
    """c = sum_k 0.5^(K/BK-1-k) a_k @ b_k.T through multi-stage shared buffers."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((BM, BK), (m, None)), b.tile((BN, BK), (n, None))
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    acc = tg.zeros((BM, BN), f32)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        acc = acc * 0.5
        tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc, c.tile((BM, BN), (m, n)))


def test_pipeline_with_shared_stages_carries_a_rebound_accumulator():
    M, N, K, BK = 40, 48, 80, 16   # ragged M and N; 5 k-steps through 3 stages
    a = rand(M, K, seed=41).astype(np.float16)
    b = rand(N, K, seed=42).astype(np.float16)
    c = poisoned(M, N)
    tg.emulate(decayed_gemm, (tg.cdiv(M, 32), tg.cdiv(N, 32)), a, b, c)
    want = np.zeros((M, N))
    for k in range(0, K, BK):
        want = want * 0.5 + a[:, k:k + BK].astype(np.float64) @ b[:, k:k + BK].astype(
            np.float64).T
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


@tg.kernel(threads=64)
def mixed(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8, BN: tg.constexpr = 16):
    """In-place updates (+=, *=, .assign, tg.copy into the tile) mixed with rebinding."""
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.full((BM, BN), 1.0, f32)
    inplace = tg.zeros((BM, BN), f32)
    for k in tg.range(xs.shape[2]):
        t = tg.load(xs[:, :, k])
        acc += t              # writes the carried tile
        acc = acc * 0.5       # rebinding: the next iteration must see it
        acc *= 2.0
        acc = acc - 0.25
        inplace.assign(inplace * 0.5 + t)
        acc += inplace
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


def test_rebinding_mixed_with_in_place_updates():
    M, N = 13, 70
    x, y = rand(M, N, seed=51), poisoned(M, 16)
    tg.emulate(mixed, (tg.cdiv(M, 8),), x, y)
    acc, inplace = np.ones((M, 16)), np.zeros((M, 16))
    for t in chunks(x, 16):
        acc = ((acc + t) * 0.5) * 2.0 - 0.25
        inplace = inplace * 0.5 + t
        acc = acc + inplace
    np.testing.assert_allclose(y, acc, rtol=1e-5, atol=1e-5)


# -- branches, containers, helpers -------------------------------------------------------------
@tg.kernel(threads=64)
def branchy(x: tg.Tensor[f32], y: tg.Tensor[f32], limit: int, BM: tg.constexpr = 8,
            BN: tg.constexpr = 16):
    """Rebinding inside tg.if_ / tg.else_ in a loop, and a value defined in both branches."""
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.zeros((BM, BN), f32)
    for k in tg.range(xs.shape[2]):
        t = tg.load(xs[:, :, k])
        with tg.if_(k < limit):
            acc = acc + t
            step = t * 2.0
        with tg.else_():
            acc = acc - t * 0.5
            step = t * 3.0
        acc = acc + step
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


@pytest.mark.parametrize("limit", [0, 2, 9])
def test_rebinding_inside_if_and_else_in_a_loop(limit):
    M, N = 13, 80
    x, y = rand(M, N, seed=61), poisoned(M, 16)
    tg.emulate(branchy, (tg.cdiv(M, 8),), x, y, limit)
    acc = np.zeros((M, 16))
    for k, t in enumerate(chunks(x, 16)):
        acc = acc + t + 2 * t if k < limit else acc - 0.5 * t + 3 * t
    np.testing.assert_allclose(y, acc, rtol=1e-5, atol=1e-5)


@tg.kernel(threads=64)
def containers(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4,
               BN: tg.constexpr = 8, PARTS: tg.constexpr = 3):
    """A list of accumulators updated by an unrolled Python loop, a dict, a tuple."""
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    accs = [tg.zeros((BM, BN), f32) for _ in range(PARTS)]
    named = {"lo": tg.full((BM, BN), INF, f32), "hi": tg.full((BM, BN), -INF, f32)}
    pair = (tg.zeros((BM, BN), f32), tg.full((BM, BN), 1.0, f32))
    for k in tg.range(xs.shape[2]):
        t = tg.load(xs[:, :, k])
        for j in range(PARTS):
            accs[j] = accs[j] * 0.5 + t * (j + 1)
        named["lo"] = tg.minimum(named["lo"], t)
        named["hi"] = tg.maximum(named["hi"], t)
        pair = (pair[0] + t, pair[1] * 0.5)
    out = accs[0] + accs[1] * 10.0 + accs[2] * 100.0 + named["lo"] * 1000.0 + named["hi"]
    tg.copy(out + pair[0] * pair[1], y.tile((BM, BN), (m, 0)))


def test_lists_dicts_and_tuples_of_tiles_are_carried():
    M, N = 6, 36
    x, y = rand(M, N, seed=71), poisoned(M, 8)
    tg.emulate(containers, (tg.cdiv(M, 4),), x, y)
    parts = chunks(x, 8)   # the last chunk is 4 wide, padded with zeros as the loads are
    accs, lo, hi, s, scale = [np.zeros((M, 8)) for _ in range(3)], np.inf, -np.inf, 0.0, 1.0
    for t in parts:
        accs = [a * 0.5 + t * (j + 1) for j, a in enumerate(accs)]
        lo, hi, s, scale = np.minimum(lo, t), np.maximum(hi, t), s + t, scale * 0.5
    want = accs[0] + accs[1] * 10 + accs[2] * 100 + lo * 1000 + hi + s * scale
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


@tg.kernel(threads=64)
def nested_prefetch(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
                    BN: tg.constexpr = 16):
    """Tiles loaded a step ahead, held two containers deep (a list of (tile, [tile]))."""
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.zeros((BM, BN), f32)
    ahead = [(tg.load(xs[:, :, 0]), [tg.load(xs[:, :, 0]) * 2.0])]
    for k in tg.range(xs.shape[2]):
        current = ahead
        ahead = [(tg.load(xs[:, :, k + 1]), [tg.load(xs[:, :, k + 1]) * 2.0])]
        acc = acc + current[0][0] + current[0][1][0] * 10.0
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


def test_tiles_nested_two_containers_deep_are_carried():
    """Each step uses the tiles the step before loaded (before the fix, a tile two
    containers deep was not carried: every step silently reused the first chunk)."""
    M, N = 6, 40
    x, y = rand(M, N, seed=91), poisoned(M, 16)
    tg.emulate(nested_prefetch, (tg.cdiv(M, 8),), x, y)
    want = sum(t * 21.0 for t in chunks(x, 16))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


def accumulate(acc, xs, scale):
    """A helper with its own loop: its parameter is carried, the caller's tile is not."""
    for k in tg.range(xs.shape[2]):
        acc = acc * scale + tg.load(xs[:, :, k])
    return acc


@tg.kernel(threads=64)
def helper_loops(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
                 BN: tg.constexpr = 16):
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    start = tg.full((BM, BN), 2.0, f32)
    halves = accumulate(start, xs, 0.5)
    start = accumulate(start, xs, 1.0)      # `start` itself must still be 2.0 here
    tg.copy(halves + start * 3.0, y.tile((BM, BN), (m, 0)))


def test_a_helper_rebinding_its_parameter_leaves_the_callers_tile_alone():
    M, N = 13, 70
    x, y = rand(M, N, seed=81), poisoned(M, 16)
    tg.emulate(helper_loops, (tg.cdiv(M, 8),), x, y)
    halves, ones = np.full((M, 16), 2.0), np.full((M, 16), 2.0)
    for t in chunks(x, 16):
        halves, ones = halves * 0.5 + t, ones + t
    np.testing.assert_allclose(y, halves + 3 * ones, rtol=1e-5, atol=1e-5)


def step(acc, t):
    return acc * 0.5 + t


def rebind_locally(acc, t):
    acc = acc + t   # rebinds the helper's own name only: the caller's acc is unchanged
    return None


@tg.kernel(threads=64)
def helper_in_body(x: tg.Tensor[f32], y: tg.Tensor[f32], limit: int, BM: tg.constexpr = 8,
                   BN: tg.constexpr = 16):
    m = tg.block_id(0)
    xs = x.tile((BM, BN), (m, None))
    acc = tg.full((BM, BN), 1.0, f32)
    for k in tg.range(xs.shape[2]):
        t = tg.load(xs[:, :, k])
        acc = step(acc, t)
        rebind_locally(acc, t * 100.0)
        with tg.if_(k < limit):       # no else: acc keeps its value where k >= limit
            acc = acc * 2.0
    tg.copy(acc, y.tile((BM, BN), (m, 0)))


@pytest.mark.parametrize("limit", [0, 2])
def test_helpers_called_from_the_body_and_an_if_without_else(limit):
    M, N = 13, 70
    x, y = rand(M, N, seed=91), poisoned(M, 16)
    tg.emulate(helper_in_body, (tg.cdiv(M, 8),), x, y, limit)
    acc = np.ones((M, 16))
    for k, t in enumerate(chunks(x, 16)):
        acc = acc * 0.5 + t
        acc = acc * 2.0 if k < limit else acc
    np.testing.assert_allclose(y, acc, rtol=1e-5, atol=1e-5)


@tg.kernel(threads=64)
def reused_name(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 8,
                BN: tg.constexpr = 16):
    """A name declared before the loop but only written inside it (a reused temporary)."""
    m = tg.block_id(0)
    xs, ys = x.tile((BM, BN), (m, None)), y.tile((BM, BN), (m, None))
    t = tg.register((BM, BN), f32)       # never written before the loop
    for k in tg.range(xs.shape[2]):
        t = tg.load(xs[:, :, k]) * 3.0
        tg.copy(t, ys[:, :, k])


def test_a_name_first_written_inside_the_loop_needs_no_value_before_it():
    x, y = rand(13, 70, seed=95), poisoned(13, 70)
    tg.emulate(reused_name, (tg.cdiv(13, 8),), x, y)
    np.testing.assert_allclose(y, x * 3.0, rtol=1e-6)
