"""Every `torch.ops.tegula.*` op under CUDA-graph capture (issue 14): called once eagerly
(compiles and tunes outside the capture), captured, its floating-point inputs then
overwritten in place with new random values, the graph replayed — the replay's outputs
must match the eager op's on the new inputs, every element. An op that cannot be captured (a host sync, an allocation the capture
refuses) fails here with torch's message."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the CPU tests' operand builders

pytestmark = pytest.mark.gpu


def _operands(name):
    """CPU operands of op `name` (those of its CPU tests)."""
    import test_torch_ops_attention as att
    import test_torch_ops_moe as moe
    import torch_ops_operands as ops
    rand = ops._random
    if name == "matmul":
        return rand((70, 64), torch.float16, 1), rand((64, 40), torch.float16, 2), \
            rand((40,), torch.float16, 3), "gelu"
    if name == "matmul_fp8":
        a = rand((64, 128), seed=1).to(torch.float8_e4m3fn)
        b = rand((96, 128), seed=2).to(torch.float8_e4m3fn).T
        return a, b, torch.tensor(0.5), torch.tensor(0.25)
    table = {
        "rms_norm": lambda: (rand((6, 1000), torch.bfloat16, 1), rand((1000,), torch.bfloat16, 2),
                             1e-6),
        "softmax": lambda: (rand((7, 3000), torch.float16, 1, 3.0),),
        "copy": lambda: (rand((9, 333), torch.float16, 1),),
        "gemv": lambda: (rand((3, 512), torch.float16, 1), rand((256, 512), torch.float16, 2)),
        "matmul_w4a16": lambda: ops._w4a16_operands(16, 256, 512, 128, True, 5) + (128,),
        "attention_decode": lambda: ops._decode_operands(4, paged=True),
        "selective_scan": lambda: ops._scan_operands(6, torch.bfloat16),
        "attention_forward": lambda: att._attention_operands(3) + (True, None),
        "attention_varlen": lambda: att._varlen_operands(1) + (None, True, None),
        "moe_gemm": lambda: att._moe_operands(2),
        "moe_gemm_w4a16": lambda: moe._w4_operands(12, True),
        "moe_mlp": lambda: moe._mlp_operands(11, tokens=40)[0],
    }
    if name == "attention_backward":
        q, k, v = att._attention_operands(3)
        o, lse = torch.ops.tegula.attention_forward(q, k, v, True, None)
        return q, k, v, o, lse, rand(o.shape, o.dtype, 4), True, None
    return table[name]()


def _outputs(result):
    return result if isinstance(result, (tuple, list)) else (result,)


@pytest.mark.parametrize("name", sorted(
    __import__("tegula.kernels.torch_ops", fromlist=["OPS"]).OPS))
def test_every_op_replays_in_a_cuda_graph(name):
    op = getattr(torch.ops.tegula, name)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in _operands(name)]
    op(*args)  # compiles and tunes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _outputs(op(*args))
    # New values in the same tensors (floating point data only: ids, offsets, lengths and
    # page tables keep their meaning).
    generator = torch.Generator(device="cuda").manual_seed(7)
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16,
                                                         torch.float32):
            a.copy_(torch.randn(a.shape, device="cuda", generator=generator).to(a.dtype))
    graph.replay()
    torch.cuda.synchronize()
    eager = _outputs(op(*args))
    for got, want in zip(captured, eager, strict=True):
        # (a tolerance, not equality: a split reduction may add in another order; a replay
        # that read the old inputs differs everywhere)
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2, equal_nan=True)
