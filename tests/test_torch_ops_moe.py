"""The MoE custom ops built on the grouped GEMM: `torch.ops.tegula.moe_gemm_w4a16` (4-bit
expert weights) and `moe_mlp` (the whole MLP). On CPU they run the emulated kernels:
results against float64 references (every element of every expert's rows), opcheck, fake
shapes on CUDA fake tensors with bad calls named, and `torch.compile(fullgraph=True)` of
a model calling both. The CUDA runs are marked `gpu`."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tegula.dtypes import bf16  # noqa: E402
from tegula.kernels import moe_layer  # noqa: E402
from tegula.kernels import torch_ops  # noqa: E402,F401  (registers torch.ops.tegula.*)
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "kernels"))
from test_moe_layer import problem, reference  # noqa: E402


def _random(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _w4_operands(seed, zero_point, offsets=(0, 5, 5, 14)):
    """Rows of 3 experts (5, 0 and 9: an empty expert), N=40, K=64, groups of 32."""
    from tegula.kernels.moe_w4 import quantize_experts_w4
    x = _random((offsets[-1], 64), torch.bfloat16, seed)
    w = _random((3, 40, 64), torch.float32, seed + 1, 0.2)
    packed, scales, zeros = quantize_experts_w4(w.bfloat16(), 32, zero_point)
    return x, packed, scales, zeros, 32, torch.tensor(offsets, dtype=torch.int32)


@pytest.mark.slow
@pytest.mark.parametrize("zero_point", [True, False])
def test_moe_gemm_w4a16_op_on_cpu_against_float64(zero_point):
    from tegula.kernels.quant import dequantize_w4, unpack_w4
    args = _w4_operands(3, zero_point)
    x, packed, scales, zeros, group, offsets = args
    out = torch.ops.tegula.moe_gemm_w4a16(*args)
    assert (out.shape, out.dtype) == ((14, 40), torch.bfloat16)
    for e in range(3):
        w = dequantize_w4(unpack_w4(packed[e].numpy()), scales[e].float().numpy(),
                          None if zeros is None else zeros[e].float().numpy(), group)
        rows = slice(offsets[e].item(), offsets[e + 1].item())
        ref = x[rows].double() @ torch.from_numpy(np.asarray(w, np.float64)).T
        assert torch.all((out[rows].double() - ref).abs() <= 2 ** -7 * (ref.abs() + 1)), e
    torch.library.opcheck(torch.ops.tegula.moe_gemm_w4a16.default, args)


def _mlp_operands(seed, tokens=11, top_k=2):
    x, w13, w2, ids, weights = problem(seed, tokens, 4, top_k, 32, 16, bf16)
    t = lambda a: torch.from_numpy(a).bfloat16()  # noqa: E731
    return (t(x), t(w13), t(w2), torch.from_numpy(ids), torch.from_numpy(weights)), \
        (x, w13, w2, ids, weights)


@pytest.mark.slow
def test_moe_mlp_op_on_cpu_against_float64_token_by_token():
    args, arrays = _mlp_operands(5)
    y = torch.ops.tegula.moe_mlp(*args)
    ref = reference(*arrays, bf16)
    assert (y.shape, y.dtype) == ((11, 32), torch.bfloat16)
    assert np.all(np.abs(y.float().numpy() - ref) <= 2.0 ** -5 * np.abs(ref).max())
    torch.library.opcheck(torch.ops.tegula.moe_mlp.default, args)


def test_moe_mlp_refuses_routing_of_another_token_count():
    """topk_ids / topk_weights for 7 tokens with x of 11 rows: before the check the MLP
    returned 7 rows, silently; now the entry point, the emulator and the op's fake name
    the shapes."""
    args, (x, w13, w2, ids, weights) = _mlp_operands(6)
    match = r"moe_mlp\w*: topk_ids and topk_weights must both be \(T, k\) with T = 11"
    with pytest.raises(ValueError, match=match):
        moe_layer.moe_mlp_emulated(x, w13, w2, ids[:7], weights[:7], dtype=bf16)
    with pytest.raises(ValueError, match=match):
        moe_layer.moe_mlp(*args[:3], args[3][:7], args[4][:7])
    with pytest.raises(ValueError, match=r"got topk_ids \(11, 2\) and topk_weights \(11, 1\)"):
        torch.ops.tegula.moe_mlp(*args[:4], args[4][:, :1])


def test_fakes_give_cuda_shapes_and_report_bad_calls():
    args, _ = _mlp_operands(7)
    w4 = _w4_operands(8, True)
    with FakeTensorMode():
        cuda = lambda ts: [torch.empty(t.shape, dtype=t.dtype, device="cuda")  # noqa: E731
                           if isinstance(t, torch.Tensor) else t for t in ts]
        y = torch.ops.tegula.moe_mlp(*cuda(args))
        assert (y.shape, y.dtype, y.device.type) == ((11, 32), torch.bfloat16, "cuda")
        out = torch.ops.tegula.moe_gemm_w4a16(*cuda(w4))
        assert (out.shape, out.dtype, out.device.type) == ((14, 40), torch.bfloat16, "cuda")
        bad = cuda(args)
        with pytest.raises(TypeError, match="moe_mlp: w2 has dtype torch.float16"):
            torch.ops.tegula.moe_mlp(*bad[:2], bad[2].half(), *bad[3:])
        bad = cuda(w4)
        with pytest.raises(ValueError, match="moe_gemm_w4a16: group_size must be one of"):
            torch.ops.tegula.moe_gemm_w4a16(*bad[:4], 48, bad[5])


def test_compile_fullgraph_traces_both_ops_without_graph_breaks():
    args, arrays = _mlp_operands(9, tokens=6, top_k=1)
    w4 = _w4_operands(10, False, offsets=(0, 2, 4, 6))

    def model(x, w13, w2, ids, weights, packed, scales):
        y = torch.ops.tegula.moe_mlp(x, w13, w2, ids, weights)
        return torch.ops.tegula.moe_gemm_w4a16(y.repeat(1, 2), packed, scales, None, 32, w4[5])

    inputs = (*args, w4[1], w4[2])
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(*inputs)
    assert torch.equal(compiled, model(*inputs))


# ------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_opcheck_on_cuda():
    args, _ = _mlp_operands(11, tokens=40)
    torch.library.opcheck(torch.ops.tegula.moe_mlp.default,
                          tuple(t.cuda() for t in args))
    w4 = _w4_operands(12, True)
    torch.library.opcheck(torch.ops.tegula.moe_gemm_w4a16.default,
                          tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in w4))
