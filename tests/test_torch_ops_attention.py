"""The attention and MoE custom ops: `torch.ops.tegula.attention_forward` with its backward
(`attention_backward`, registered as its autograd formula), `attention_varlen` and
`moe_gemm`. On CPU they run the emulated kernels: results against float64 references
(every element), `torch.library.opcheck`, fake shapes on CUDA fake tensors and bad calls
named, and `torch.compile(fullgraph=True)` of a model (and a training step) calling them.
The CUDA runs are marked `gpu`."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tegula.kernels import torch_ops  # noqa: E402,F401  (registers torch.ops.tegula.*)
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def _random(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _reference(q, k, v, causal, scale):
    """(o, lse) in float64 of (B, H, Sq, D) q and (B, Hkv, Sk, D) k, v, causal aligned
    bottom-right (query i sees keys j <= i + Sk - Sq)."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        seen = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        s = s.masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, lse


def _close(got, want, tol):
    got, want = got.double(), want.double()
    assert torch.all((got - want).abs() <= tol * (want.abs() + 1)), (got - want).abs().max()


# ------------------------------------------------------------------- attention + backward

def _attention_operands(seed=0, dtype=torch.bfloat16):
    """q (1, 2, 9, 64) against 13 keys of one kv head (GQA), small enough to emulate."""
    q = _random((1, 2, 9, 64), dtype, seed)
    k = _random((1, 1, 13, 64), dtype, seed + 1)
    v = _random((1, 1, 13, 64), dtype, seed + 2)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradients_through_the_op_match_float64(causal):
    """o.backward() through `torch.ops.tegula.attention_forward` runs the backward op (the
    emulated backward kernels): dq, dk (summed over the query heads of the kv head) and
    dv against float64 autograd of the reference, every element; lse gets no gradient."""
    q, k, v = (t.requires_grad_() for t in _attention_operands(3))
    upstream = _random((1, 2, 9, 64), torch.bfloat16, 9)
    o, lse = torch.ops.tegula.attention_forward(q, k, v, causal, 0.125)
    assert o.requires_grad and not lse.requires_grad
    o.backward(upstream)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want_o, _ = _reference(*leaves, causal, 0.125)
    want_o.backward(upstream.double())
    _close(o, want_o.detach(), 2 ** -7)
    for got, want in zip((q.grad, k.grad, v.grad), leaves):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        _close(got, want.grad, 2 ** -6)


@pytest.mark.slow
def test_attention_backward_op_on_cpu_and_opcheck():
    q, k, v = _attention_operands(5, torch.float16)
    o, lse = torch.ops.tegula.attention_forward(q, k, v, True, None)
    grad_o = _random(o.shape, torch.float16, 8)
    dq, dk, dv = torch.ops.tegula.attention_backward(q, k, v, o, lse, grad_o, True, None)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))
    torch.library.opcheck(torch.ops.tegula.attention_backward.default,
                          (q, k, v, o, lse, grad_o, True, None))
    # the forward with inputs requiring grad: opcheck checks the autograd registration
    leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.tegula.attention_forward.default, leaves + (False, 0.2))


def test_a_compiled_training_step_runs_the_attention_backward_op():
    q, k, v = _attention_operands(11)
    upstream = _random((1, 2, 9, 64), torch.bfloat16, 12)

    def loss(q, k, v):
        o, _ = torch.ops.tegula.attention_forward(q, k, v, True, None)
        return (o.float() * upstream.float()).sum()

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    explained = torch._dynamo.explain(loss)(q, k, v)
    assert explained.graph_break_count == 0
    assert "torch.ops.tegula.attention_forward" in explained.graphs[0].code
    eager = grads(loss)
    compiled = grads(torch.compile(loss, fullgraph=True, backend="aot_eager"))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------- varlen

def _varlen_operands(seed=0, dtype=torch.float16):
    """Two packed sequences: queries 4 and 7 (total 11), keys 6 and 5 (total 11); H=2
    query heads on one kv head, D=64."""
    q = _random((11, 2, 64), dtype, seed)
    k = _random((11, 1, 64), dtype, seed + 1)
    v = _random((11, 1, 64), dtype, seed + 2)
    cu_q = torch.tensor([0, 4, 11], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 11], dtype=torch.int32)
    return q, k, v, cu_q, cu_k, 7


@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen_op_on_cpu_against_float64(causal):
    q, k, v, cu_q, cu_k, longest = _varlen_operands(2)
    o, lse = torch.ops.tegula.attention_varlen(q, k, v, cu_q, cu_k, longest, None, causal, None)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == \
        (q.shape, q.dtype, (2, 11), torch.float32)
    for (q0, q1), (k0, k1) in zip(zip(cu_q[:-1].tolist(), cu_q[1:].tolist()),
                                  zip(cu_k[:-1].tolist(), cu_k[1:].tolist())):
        as_bhsd = lambda t: t.transpose(0, 1)[None]  # noqa: E731 (S, H, D) -> (1, H, S, D)
        want_o, want_lse = _reference(as_bhsd(q[q0:q1]), as_bhsd(k[k0:k1]),
                                      as_bhsd(v[k0:k1]), causal, 64 ** -0.5)
        _close(as_bhsd(o[q0:q1]), want_o, 2 ** -9)
        assert torch.allclose(lse[:, q0:q1].double(), want_lse[0], atol=1e-4)


@pytest.mark.slow
def test_attention_varlen_opcheck_on_cpu():
    torch.library.opcheck(torch.ops.tegula.attention_varlen.default,
                          _varlen_operands(4) + (None, True, 0.3))


# ---------------------------------------------------------------------------------- MoE

def _moe_operands(seed=0, fp8=False):
    """Rows of 3 experts (5, 0 and 9 rows: an empty expert), N=40, K=48."""
    x = _random((14, 48), torch.bfloat16, seed)
    w = _random((3, 40, 48), torch.float32, seed + 1, 0.2)
    offsets = torch.tensor([0, 5, 5, 14], dtype=torch.int32)
    if not fp8:
        return x, w.bfloat16(), offsets
    from tegula.kernels.moe import quantize_experts_fp8
    w_q, w_scale = quantize_experts_fp8(w)
    return x, w_q, offsets, w_scale


@pytest.mark.parametrize("fp8", [False, True])
def test_moe_gemm_op_on_cpu_against_float64(fp8):
    args = _moe_operands(6, fp8)
    out = torch.ops.tegula.moe_gemm(*args)
    x, w, offsets = args[:3]
    assert (out.shape, out.dtype) == ((14, 40), torch.bfloat16)
    weights = w.double() * (args[3].double()[:, None, None] if fp8 else 1)
    for e in range(3):
        rows = slice(offsets[e].item(), offsets[e + 1].item())
        if fp8:  # x quantized per row to e4m3 first, as the kernel does
            from tegula.kernels.moe import quantize_rows_fp8
            x_q, x_scale = quantize_rows_fp8(x[rows])
            lhs = x_q.double() * x_scale.double()
        else:
            lhs = x[rows].double()
        _close(out[rows], lhs @ weights[e].T, 2 ** -7)
    _opcheck_moe(args)


def _opcheck_moe(args):
    """opcheck; with FP8 weights, its schema check (which compares the inputs before and
    after with `allclose`, not implemented for float8 tensors) is done here on the bytes."""
    if args[1].dtype != torch.float8_e4m3fn:
        torch.library.opcheck(torch.ops.tegula.moe_gemm.default, args)
        return
    before = [t.view(torch.uint8).clone() if t.dtype == torch.float8_e4m3fn else t.clone()
              for t in args]
    torch.ops.tegula.moe_gemm(*args)
    for t, kept in zip(args, before):
        assert torch.equal(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t, kept)
    torch.library.opcheck(torch.ops.tegula.moe_gemm.default, args,
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_compile_fullgraph_traces_varlen_and_moe_without_graph_breaks():
    q, k, v, cu_q, cu_k, longest = _varlen_operands(7)
    x, w, offsets = _moe_operands(8)

    def model(q, k, v, x, w):
        o, _ = torch.ops.tegula.attention_varlen(q, k, v, cu_q, cu_k, longest)
        return o.sum() + torch.ops.tegula.moe_gemm(x, w, offsets).float().sum()

    assert torch._dynamo.explain(model)(q, k, v, x, w).graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v, x, w), model(q, k, v, x, w))


# ----------------------------------------------------------------------- fakes, mistakes

def test_fakes_give_cuda_shapes_and_report_bad_calls():
    with FakeTensorMode():
        cuda = lambda t: torch.empty(t.shape, dtype=t.dtype, device="cuda")  # noqa: E731
        operands = _varlen_operands()
        q, k, v, cu_q, cu_k, longest = (cuda(t) if isinstance(t, torch.Tensor) else t
                                        for t in operands)
        o, lse = torch.ops.tegula.attention_varlen(q, k, v, cu_q, cu_k, longest)
        assert (o.shape, o.device.type, lse.shape, lse.dtype) == \
            ((11, 2, 64), "cuda", (2, 11), torch.float32)
        with pytest.raises(TypeError, match="attention_varlen: cu_seqlens_k has dtype"):
            torch.ops.tegula.attention_varlen(q, k, v, cu_q, cu_k.long(), longest)
        with pytest.raises(ValueError, match="attention_varlen: cu_seqlens_q"):
            torch.ops.tegula.attention_varlen(q, k, v, cuda(operands[3][:2]), cu_k, longest)
        moe = _moe_operands()
        x, w, offsets = (cuda(t) for t in moe)
        out = torch.ops.tegula.moe_gemm(x, w, offsets)
        assert (out.shape, out.dtype, out.device.type) == ((14, 40), torch.bfloat16, "cuda")
        with pytest.raises(ValueError, match="moe_gemm: expert_offsets must hold"):
            torch.ops.tegula.moe_gemm(x, w, cuda(moe[2][:3]))
        with pytest.raises(TypeError, match="moe_gemm: w has dtype"):
            torch.ops.tegula.moe_gemm(x, w.half(), offsets)
        q, k, v = (cuda(t) for t in _attention_operands())
        o, lse = torch.ops.tegula.attention_forward(q, k, v)
        short_lse = torch.empty(1, 2, 4, dtype=torch.float32, device="cuda")
        dq, dk, dv = torch.ops.tegula.attention_backward(q, k, v, o, lse, o)
        assert (dq.shape, dk.shape, dv.shape, dk.device.type) == \
            (q.shape, k.shape, v.shape, "cuda")
        with pytest.raises(ValueError, match="attention_backward: lse has shape"):
            torch.ops.tegula.attention_backward(q, k, v, o, short_lse, o)
        with pytest.raises(TypeError, match="attention_backward: lse has dtype"):
            torch.ops.tegula.attention_backward(q, k, v, o, lse.half(), o)


# ------------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["attention_varlen", "moe_gemm", "moe_gemm fp8",
                                  "attention_forward", "attention_backward"])
def test_opcheck_on_cuda(name):
    if name.startswith("attention_varlen"):
        args = _varlen_operands(1) + (None, True, None)
    elif name.startswith("moe_gemm"):
        args = _moe_operands(2, fp8=name.endswith("fp8"))
    else:
        q, k, v = _attention_operands(3)
        if name == "attention_forward":
            args = tuple(t.requires_grad_() for t in (q, k, v)) + (True, None)
        else:
            o, lse = torch.ops.tegula.attention_forward(q, k, v, True, None)
            args = (q, k, v, o, lse, _random(o.shape, o.dtype, 4), True, None)
    cuda = tuple(a.detach().cuda().requires_grad_(a.requires_grad)
                 if isinstance(a, torch.Tensor) else a for a in args)
    if name.startswith("moe_gemm"):
        _opcheck_moe(cuda)
    else:
        torch.library.opcheck(getattr(torch.ops.tegula, name).default, cuda)


@pytest.mark.gpu
def test_attention_op_gradients_and_compiled_step_on_cuda():
    """The CUDA backward through the op against float64, and the same step compiled with
    inductor (fullgraph) giving the same gradients."""
    q, k, v = (t.cuda() for t in _attention_operands(21))
    upstream = _random((1, 2, 9, 64), torch.bfloat16, 22).cuda()

    def loss(q, k, v):
        return (torch.ops.tegula.attention_forward(q, k, v, True, None)[0].float()
                * upstream.float()).sum()

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    eager, compiled = grads(loss), grads(torch.compile(loss, fullgraph=True))
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    (_reference(*leaves, True, 64 ** -0.5)[0] * upstream.cpu().double()).sum().backward()
    for got, again, want in zip(eager, compiled, leaves):
        _close(got.cpu(), want.grad, 2 ** -6)
        _close(again.cpu(), want.grad, 2 ** -6)
