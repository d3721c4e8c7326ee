"""FlashAttention forward in tegula: `o = softmax(q @ k.T * scale) @ v`, one program per
(query block, head, batch), the softmax computed online over key blocks.

    python examples/attention.py          # emulates it on the CPU and checks it
    tegula explain examples/attention.py:attention_fwd --target sm_90a

The library version (`tegula.kernels.attention`: GQA, variable lengths, head dims up to
256, every layout choice autotuned on the GPU) is the same loop; this is it written out for
one head dim of 64, f16. Causal masks are aligned bottom-right as FlashAttention's: query i
sees key j when j <= i + Sk - Sq.
"""
from __future__ import annotations

import math

import numpy as np

import tegula as tg
from tegula import f16, f32

INF = float("inf")
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E): one hardware ex2 per element


@tg.kernel(threads=128)
def attention_fwd(q: tg.Tensor[f16, 4], k: tg.Tensor[f16, 4], v: tg.Tensor[f16, 4],
                  o: tg.Tensor[f16, 4], lse: tg.Tensor[f32, 3],
                  D: tg.constexpr = 64, QK_SCALE: tg.constexpr = LOG2E / 8,
                  CAUSAL: tg.constexpr = False, BM: tg.constexpr = 64,
                  BN: tg.constexpr = 64, STAGES: tg.constexpr = 2):
    m, h, b = tg.block_id(0), tg.block_id(1), tg.block_id(2)
    kv_head = h // (q.shape[1] // k.shape[1])             # GQA: heads share K/V
    seq_q, seq_k = q.shape[2], k.shape[2]
    sq = tg.shared((BM, D), f16)
    tg.copy(q[b, h].tile((BM, D), (m, 0)), sq)
    keys = k[b, kv_head].tile((BN, D), (None, 0))         # (BN, D, key blocks)
    values = v[b, kv_head].tile((BN, D), (None, 0))
    sk = tg.shared((BN, D), f16, stages=STAGES)
    sv = tg.shared((BN, D), f16, stages=STAGES)
    rows = tg.arange(BM, offset=m * BM)
    m_i = tg.full((BM, 1), -INF, f32)                     # running row max (base 2)
    l_i = tg.zeros((BM, 1), f32)                          # running sum of exp2(s - m_i)
    acc = tg.zeros((BM, D), f32)
    blocks = tg.cdiv(seq_k, BN)
    if CAUSAL:  # stop after the last key block any row of this block can see
        blocks = tg.minimum(blocks, ((m + 1) * BM + seq_k - seq_q + BN - 1) // BN)
    for j in tg.pipeline(blocks, stages=STAGES):
        tg.copy(keys[:, :, j], sk[j])
        tg.copy(values[:, :, j], sv[j])
        s = tg.zeros((BM, BN), f32)
        tg.gemm(s, sq, sk[j])                             # s = q @ k.T
        cols = tg.arange(BN, offset=j * BN)
        visible = cols[None, :] < seq_k                   # keys past the end
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + (seq_k - seq_q))
        s = tg.where(visible, s * QK_SCALE, -INF)
        m_new = tg.maximum(m_i, tg.max(s, 1))
        m_base = tg.where(m_new == -INF, 0.0, m_new)      # a row that saw nothing: no NaN
        p = tg.exp2(s - m_base)
        alpha = tg.exp2(m_i - m_base)                     # rescale what came before
        l_i = l_i * alpha + tg.sum(p, 1)
        acc *= alpha
        tg.gemm(acc, p.to(f16), sv[j].T)                  # acc += p @ v
        m_i = m_new
    unseen = l_i == 0.0                                   # rows that see no key: o = 0
    l_safe = tg.where(unseen, 1.0, l_i)
    tg.copy((acc * (1.0 / l_safe)).to(f16), o[b, h].tile((BM, D), (m, 0)))
    row_lse = tg.where(unseen, -INF, (m_i + tg.log2(l_safe)) * (1.0 / LOG2E))
    tg.copy(row_lse[:, 0], lse[b, h].tile((BM,), (m,)))


def reference(q, k, v, causal):
    """o and the natural-log log-sum-exp in float64, the causal mask written out."""
    sq, sk, d = q.shape[2], k.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(t.astype(np.float64), group, axis=1) for t in (k, v))
    s = q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) / math.sqrt(d)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    top = s.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    o = e @ vv / np.where(total > 0, total, 1.0)
    return o, np.where(total[..., 0] > 0, np.log(np.maximum(total[..., 0], 1e-300)) +
                       top[..., 0], -np.inf)


def main(b: int = 1, h: int = 4, h_kv: int = 2, sq: int = 70, sk: int = 50,
         causal: bool = True) -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, sq, 64)).astype(np.float16)
    k = rng.standard_normal((b, h_kv, sk, 64)).astype(np.float16)
    v = rng.standard_normal((b, h_kv, sk, 64)).astype(np.float16)
    o = np.full(q.shape, np.nan, np.float16)
    lse = np.full((b, h, sq), np.nan, np.float32)
    tg.emulate(attention_fwd, (tg.cdiv(sq, 64), h, b), q, k, v, o, lse, CAUSAL=causal)
    want_o, want_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(o.astype(np.float64), want_o, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    masked = int(np.isneginf(lse).sum())
    print(f"attention {b}x{h}x{sq}x64 against {h_kv} kv heads of {sk} keys, causal={causal}: "
          f"ok ({masked} rows see no key: o = 0, lse = -inf)")


if __name__ == "__main__":
    main()
