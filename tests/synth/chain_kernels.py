"""A chain of two gemms for the tests of synth/chains.py and their GPU counterparts:
attention over one block of 64 queries — S = Q Kᵀ, P = exp(S - rowmax), O += P V with P,
cast to f16, the second gemm's A operand in registers — keys masked past the end."""
import tegula as tg
from tegula import f16, f32


@tg.kernel(threads=128)
def attention_block(q: tg.Tensor[f16], k: tg.Tensor[f16], v: tg.Tensor[f16], o: tg.Tensor[f16],
                    BM: tg.constexpr = 64, BN: tg.constexpr = 64, D: tg.constexpr = 64):
    m = tg.block_id(0)
    sq = tg.shared((BM, D), f16)
    tg.copy(q.tile((BM, D), (m, 0)), sq)
    sk = tg.shared((BN, D), f16)
    sv = tg.shared((D, BN), f16)
    acc = tg.zeros((BM, D), f32)
    m_i = tg.full((BM, 1), -float("inf"), f32)
    l_i = tg.zeros((BM, 1), f32)
    gk = k.tile((BN, D), (None, 0))
    gv = v.T.tile((D, BN), (0, None))
    for j in tg.range(gk.shape[2]):
        tg.copy(gk[:, :, j], sk, fill=0.0)
        tg.copy(gv[:, :, j], sv, fill=0.0)
        s = tg.zeros((BM, BN), f32)
        tg.gemm(s, sq, sk)
        keys = tg.arange(BN, offset=j * BN)
        s = tg.where(keys < k.shape[0], s, -float("inf"))
        m_new = tg.maximum(m_i, tg.max(s, 1))
        p = tg.exp(s - m_new)
        alpha = tg.exp(m_i - m_new)
        l_i = l_i * alpha + tg.sum(p, 1)
        acc = acc * alpha
        tg.gemm(acc, p.to(f16), sv)
        m_i = m_new
    tg.copy((acc / l_i).to(f16), o.tile((BM, D), (m, 0)))


@tg.kernel(threads=128)
def two_chunk_chain(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16], o: tg.Tensor[f32],
                    BM: tg.constexpr = 64, BN: tg.constexpr = 128):
    """s = a[:, :64] b[:, :64]ᵀ + a[:, 64:] b[:, 64:]ᵀ (two gemms into one accumulator),
    then o = s.to(f16) @ cᵀ: the chain's first end is a pair of gemms that must move
    together."""
    sa0, sa1 = tg.shared((BM, 64), f16), tg.shared((BM, 64), f16)
    sb0, sb1 = tg.shared((BN, 64), f16), tg.shared((BN, 64), f16)
    sc = tg.shared((64, BN), f16)
    tg.copy(a.tile((BM, 64), (0, 0)), sa0)
    tg.copy(a.tile((BM, 64), (0, 1)), sa1)
    tg.copy(b.tile((BN, 64), (0, 0)), sb0)
    tg.copy(b.tile((BN, 64), (0, 1)), sb1)
    tg.copy(c.tile((64, BN), (0, 0)), sc)
    s = tg.zeros((BM, BN), f32)
    tg.gemm(s, sa0, sb0)
    tg.gemm(s, sa1, sb1)
    acc = tg.zeros((BM, 64), f32)
    tg.gemm(acc, s.to(f16), sc)
    tg.copy(acc, o.tile((BM, 64), (0, 0)))
