"""The MoE MLP (fused gate/up + SiLU·up grouped GEMM, down grouped GEMM, weighted gather) in
the emulator against numpy token by token, both targets, empty experts, ragged sizes; the
torch entry point through the emulator; shape errors."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.emulate.values import round_to
from tegula.kernels import moe, moe_layer
from tegula.kernels.common import random_input

TILES = dict(BM=16, BN=32, BK=16, STAGES=2, GROUP=3)


def reference(x, w13, w2, ids, weights, dtype):
    """float64 token by token, rounding to `dtype` where the kernels do: SiLU(gate)·up once
    (the fused kernel), each down projection, the weighted sum."""
    inner = w2.shape[2]
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = x[t].astype(np.float64) @ w13[e].T.astype(np.float64)
            gate, up = h[:inner], h[inner:]
            a = round_to((gate / (1 + np.exp(-gate)) * up).astype(np.float32), dtype)
            out[t] += weights[t, j] * round_to((a.astype(np.float64) @ w2[e].T)
                                               .astype(np.float32), dtype)
    return out


def problem(seed, tokens, experts, top_k, hidden, inner, dtype):
    rng = np.random.default_rng(seed)
    x = random_input(rng, (tokens, hidden), dtype)
    w13 = random_input(rng, (experts, 2 * inner, hidden), dtype, 0.2)
    w2 = random_input(rng, (experts, hidden, inner), dtype, 0.2)
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    logits[:, 0] = -30.0                                # expert 0 gets no token
    ids, weights = moe.route(logits, top_k)
    return x, w13, w2, ids, weights


@pytest.mark.parametrize("dtype, target, top_k", [(bf16, "sm_90a", 2), (f16, "sm_80", 1)])
def test_moe_mlp_matches_numpy_token_by_token(dtype, target, top_k):
    x, w13, w2, ids, weights = problem(21, 29, 5, top_k, 40, 24, dtype)
    assert not (ids == 0).any()
    y = moe_layer.moe_mlp_emulated(x, w13, w2, ids, weights, dtype=dtype, target=target,
                                   **TILES)
    ref = reference(x, w13, w2, ids, weights, dtype)
    # An f32 sum may land on the neighbouring value of `dtype` before the next step, and
    # the result is rounded: a few ulps of the largest output.
    assert np.all(np.abs(y - ref) <= 2.0 ** -(dtype.mantissa_bits - 2) * np.abs(ref).max())


def test_torch_moe_mlp_in_the_emulator(on_cpu):
    torch = on_cpu
    x, w13, w2, ids, weights = problem(22, 19, 4, 2, 32, 16, bf16)
    want = moe_layer.moe_mlp_emulated(x, w13, w2, ids, weights, dtype=bf16)
    t = lambda a: torch.from_numpy(a).bfloat16()  # noqa: E731
    got = moe_layer.moe_mlp(t(x), t(w13), t(w2), torch.from_numpy(ids),
                            torch.from_numpy(weights), gate_up_config=dict(threads=None))
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.float().numpy(), want)


def test_shapes_are_checked():
    x, w13, w2, ids, weights = problem(23, 5, 3, 1, 16, 8, bf16)
    with pytest.raises(ValueError, match=r"w13 \(E, 2·I, H\)"):
        moe_layer.moe_mlp_emulated(x, w13[:, :-1], w2, ids, weights, dtype=bf16)
    with pytest.raises(ValueError, match="PERSISTENT=False"):
        moe_layer.moe_gate_up_emulated(x, w13, np.int32([0, 2, 3, 5]), bf16, PERSISTENT=True)
