"""torch custom ops: the library's `torch.ops.tegula.*` and `tg.torch_op` for user kernels.

On CPU (CI) the ops run the real kernels in the emulator, so registration, schemas, fake
implementations, `torch.library.opcheck` and `torch.compile(fullgraph=True)` are checked
end to end; fake CUDA tensors check the fake implementations for the CUDA device. The
CUDA runs (opcheck, compile with inductor, CUDA-graph capture) are marked `gpu`.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tegula as tg  # noqa: E402
from tegula import f16, f32  # noqa: E402
from tegula.errors import TegulaError  # noqa: E402
from tegula.kernels import torch_ops  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ops_operands import (_decode_operands, _random, _scan_operands,  # noqa: E402
                                _w4a16_fragment_operands, _w4a16_operands)


def _ulps(dtype) -> float:
    return {torch.float32: 2.0 ** -21, torch.float16: 2.0 ** -10,
            torch.bfloat16: 2.0 ** -7}[dtype]


# ------------------------------------------------------------------------- the library ops

def test_every_entry_point_is_a_registered_op_with_its_schema():
    schemas = {name: str(getattr(torch.ops.tegula, name).default._schema)
               for name in torch_ops.OPS}
    assert schemas["matmul"] == ("tegula::matmul(Tensor a, Tensor b, Tensor? bias=None, "
                                 "str? activation=None) -> Tensor")
    assert schemas["matmul_fp8"] == ("tegula::matmul_fp8(Tensor a, Tensor b, Tensor scale_a, "
                                     "Tensor scale_b, ScalarType? out_dtype=None, "
                                     "bool block_scales=False) -> Tensor")
    assert schemas["rms_norm"].startswith("tegula::rms_norm(Tensor x, Tensor weight, float eps=")
    assert schemas["softmax"] == "tegula::softmax(Tensor x, SymInt dim=-1) -> Tensor"
    assert schemas["copy"] == "tegula::copy(Tensor x) -> Tensor"
    # Every torch entry point of the library has its op (a new entry point fails here
    # until it is registered): the public functions of api other than tuning helpers.
    assert schemas["gemv"] == "tegula::gemv(Tensor x, Tensor w) -> Tensor"
    assert schemas["matmul_w4a16"] == ("tegula::matmul_w4a16(Tensor a, Tensor packed, "
                                       "Tensor scales, Tensor? zeros, SymInt group_size) "
                                       "-> Tensor")
    api = tg.kernels.api
    entry_points = {name for name in api.__all__ if callable(getattr(api, name))
                    and not name.endswith("_candidates") and name.islower()}
    assert schemas["selective_scan"] == (
        "tegula::selective_scan(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, "
        "Tensor? D=None, Tensor? z=None, Tensor? delta_bias=None, bool delta_softplus=False)"
        " -> Tensor")
    decode = {"gemv", "matmul_w4a16", "attention_forward", "attention_backward",
              "attention_varlen", "attention_decode", "selective_scan", "moe_gemm",
              "moe_gemm_w4a16", "moe_mlp"}  # outside api
    assert entry_points | decode == set(torch_ops.OPS)
    # Every torch entry point that tegula.kernels exports (not the emulator's numpy ones,
    # not the host-side weight packers), and the MoE modules' (not re-exported), has its
    # op; `attention` is attention_forward's op with its autograd formula.
    from tegula.kernels import moe_layer, moe_w4
    packers = {"quantize_w4", "prepack", "unpack_w4", "pack_fragments"}
    exported = {name for name in tg.kernels.__all__ if callable(getattr(tg.kernels, name))
                and not name.endswith("_emulated") and name not in packers}
    exported |= {moe_layer.moe_mlp.__name__, moe_w4.moe_gemm_w4a16.__name__}
    assert {"attention_forward" if n == "attention" else n for n in exported} <= set(torch_ops.OPS)


def test_decode_gemm_ops_on_cpu_run_the_emulated_kernels():
    """`torch.ops.tegula.gemv` and `matmul_w4a16` on CPU tensors (the emulator) against
    float64 references: x @ w.T, and a @ dequantized(w).T (symmetric: zero point 8)."""
    from tegula.kernels.quant import dequantize_w4, unpack_w4
    x, w = _random((2, 64), torch.float16, 1), _random((24, 64), torch.float16, 2)
    for rows in (x, x[0]):
        y = torch.ops.tegula.gemv(rows, w)
        ref = rows.double() @ w.double().T
        assert y.shape == ref.shape and y.dtype == torch.float16
        assert torch.all((y.double() - ref).abs() <= 2e-3 * (ref.abs() + 1))
    for zero_point in (False,):  # with zero points: opcheck's case below
        a, packed, scales, zeros = _w4a16_operands(2, 16, 64, 32, zero_point, 3)
        c = torch.ops.tegula.matmul_w4a16(a, packed, scales, zeros, 32)
        w_deq = dequantize_w4(unpack_w4(packed.numpy()), scales.float().numpy(),
                              None if zeros is None else zeros.float().numpy(), 32)
        ref = a.double() @ torch.from_numpy(np.asarray(w_deq, np.float64)).T
        assert c.shape == (2, 16) and c.dtype == torch.float16
        assert torch.all((c.double() - ref).abs() <= 4e-3 * (ref.abs() + 1)), zero_point


def test_a_forward_only_op_refuses_a_backward_rather_than_dropping_the_gradient():
    """An inference op (no autograd formula) on an input that requires grad: its backward
    raises (torch.library.custom_op's autograd kernel), never a silently missing gradient
    (what an op registered below custom_op would give)."""
    x = _random((2, 64), torch.float16, 1).requires_grad_()
    y = torch.ops.tegula.gemv(x, _random((24, 64), torch.float16, 2))
    with pytest.raises(RuntimeError, match="tegula.gemv.default but no autograd formula"):
        y.float().sum().backward()


def test_w4a16_op_takes_fragment_prepacked_weights_as_the_entry_point_does():
    """`torch.ops.tegula.matmul_w4a16` accepts the 6-D weights of `pack_fragments` (as
    `tegula.kernels.matmul_w4a16` does): N and K that are not multiples of the 64 x 64
    blocks (padded), the same result as the row-major weights, fakes of the right shape,
    and a wrong 6-D shape named."""
    for m, n, k, group, zero_point in ((3, 16, 64, 32, True), (5, 72, 192, 64, False)):
        a, packed, scales, zeros = _w4a16_operands(m, n, k, group, zero_point, 6)
        fragments = _w4a16_fragment_operands(m, n, k, group, zero_point, 6)[1]
        assert fragments.dim() == 6
        row_major = torch.ops.tegula.matmul_w4a16(a, packed, scales, zeros, group)
        prepacked = torch.ops.tegula.matmul_w4a16(a, fragments, scales, zeros, group)
        assert prepacked.shape == (m, n) and torch.equal(prepacked, row_major)
        with FakeTensorMode() as mode:
            fake = torch.ops.tegula.matmul_w4a16(
                *(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                  for t in (a, fragments, scales, zeros)), group)
            assert (fake.shape, fake.dtype) == ((m, n), torch.float16)
    with pytest.raises(ValueError, match=r"pre-packed weights \(6-D, from pack_fragments\) "
                                         r"for N = 72 .* have shape \(2, 3, 4, 8, 4, 16\)"):
        torch.ops.tegula.matmul_w4a16(a, fragments[:, :, :, :, :, :8], scales, zeros, group)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_row_ops_on_cpu_run_the_emulated_kernels(dtype):
    x, w = _random((5, 300), dtype, 1, 3.0), _random((300,), dtype, 2)
    x[0, 7] = float("-inf")  # a masked logit: probability exactly 0
    p = torch.ops.tegula.softmax(x)
    ref = torch.softmax(x.double(), -1)
    assert p.dtype == dtype and p.shape == x.shape and p[0, 7] == 0
    assert torch.all((p.double() - ref).abs() <= 1e-7 + 2 * _ulps(dtype) * ref)
    x[0, 7] = 1.0
    y = torch.ops.tegula.rms_norm(x, w, 1e-5)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert y.dtype == dtype
    assert torch.all((y.double() - ref).abs() <= 1e-6 + 2 * _ulps(dtype) * ref.abs())


def test_matmul_and_copy_on_cpu():
    a, b = _random((37, 40), torch.float16, 3), _random((40, 70), torch.float16, 4)
    c = torch.ops.tegula.matmul(a, b)
    ref = a.double() @ b.double()
    bound = _ulps(torch.float16) * ref.abs() + \
        40 * 2.0 ** -24 * (a.double().abs() @ b.double().abs())
    assert c.shape == (37, 70) and torch.all((c.double() - ref).abs() <= bound)
    x = _random((3, 5, 7), torch.bfloat16, 5).transpose(0, 2)  # non-contiguous
    z = torch.ops.tegula.copy(x)
    assert z.is_contiguous() and torch.equal(z, x)
    assert torch.equal(torch.ops.tegula.matmul(a[:, :0], b[:0]), torch.zeros(37, 70, dtype=a.dtype))


@pytest.mark.parametrize("dtype, bc_dtype, options", [
    (torch.float32, None, True), (torch.float32, None, False),
    (torch.bfloat16, torch.float32, True), (torch.float16, None, True)])
def test_selective_scan_op_on_cpu_runs_the_emulated_kernel(dtype, bc_dtype, options):
    """`torch.ops.tegula.selective_scan` on CPU tensors against Mamba's reference loop in
    float64, every element (B and C may be f32 under 16-bit u)."""
    from tegula.kernels.scan import selective_scan_reference
    args = _scan_operands(7, dtype, bc_dtype, options)
    out = torch.ops.tegula.selective_scan(*args)
    assert out.shape == args[0].shape and out.dtype == dtype
    arrays = [a.double().numpy() if isinstance(a, torch.Tensor) else a for a in args]
    ref = torch.from_numpy(selective_scan_reference(*arrays))
    tol = 1e-5 if dtype == torch.float32 else 4 * _ulps(dtype)
    assert torch.all((out.double() - ref).abs() <= tol * (ref.abs() + 1))


@pytest.mark.parametrize("paged", [False, True])
def test_attention_decode_op_on_cpu_against_float64(paged):
    """`torch.ops.tegula.attention_decode` (o, lse) on CPU tensors (the emulated split-KV
    kernels): grouped heads, a shorter second sequence, a contiguous or paged cache;
    against softmax(q k^T / sqrt(D)) v and its logsumexp in float64."""
    q, k, v, lens = _decode_operands()
    o, lse = torch.ops.tegula.attention_decode(*_decode_operands(paged=paged))
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, 4, 1)
    for b in range(2):
        for h in range(4):
            keys, values = k[b, h // 2, :lens[b]].double(), v[b, h // 2, :lens[b]].double()
            s = q[b, h].double() @ keys.T / 32 ** 0.5
            ref = torch.softmax(s, -1) @ values
            assert torch.all((o[b, h].double() - ref).abs() <= 2e-3 * (ref.abs() + 1)), (b, h)
            assert torch.allclose(lse[b, h].double(), torch.logsumexp(s, -1), atol=1e-4)


@pytest.mark.parametrize("name, args", [
    ("matmul", lambda: (_random((33, 24), torch.float16), _random((24, 20), torch.float16))),
    ("rms_norm", lambda: (_random((6, 130)), _random((130,)), 1e-6)),
    ("softmax", lambda: (_random((2, 3, 70), torch.float16),)),
    ("copy", lambda: (_random((9, 33), torch.float16),)),
    ("gemv", lambda: (_random((2, 64), torch.float16), _random((24, 64), torch.float16))),
    ("matmul_w4a16", lambda: _w4a16_operands(3, 16, 64, 32, True, 4) + (32,)),
    ("matmul_w4a16", lambda: _w4a16_fragment_operands(3, 16, 64, 32, True, 4) + (32,)),
    ("attention_decode", lambda: _decode_operands(3)),
    ("selective_scan", lambda: _scan_operands(5)),
])
def test_opcheck_passes_on_cpu(name, args):
    # schema, fake tensor, autograd registration and AOT dispatch checks, on the CPU
    # implementation (the emulator) against the fake one.
    torch.library.opcheck(getattr(torch.ops.tegula, name).default, args())


def test_fake_implementations_give_cuda_shapes_and_report_bad_calls():
    with FakeTensorMode():
        a = torch.empty(100, 64, dtype=torch.float16, device="cuda")
        b = torch.empty(64, 30, dtype=torch.float16, device="cuda")
        c = torch.ops.tegula.matmul(a, b)
        assert (c.shape, c.dtype, c.device.type) == ((100, 30), torch.float16, "cuda")
        x = torch.empty(2, 3, 500, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(500, dtype=torch.bfloat16, device="cuda")
        assert torch.ops.tegula.rms_norm(x, w, 1e-6).shape == (2, 3, 500)
        assert torch.ops.tegula.softmax(x).dtype == torch.bfloat16
        assert torch.ops.tegula.copy(x.transpose(0, 2)).is_contiguous()
        with pytest.raises(TypeError, match="matmul: b has dtype torch.float32"):
            torch.ops.tegula.matmul(a, b.float())
        with pytest.raises(ValueError, match="inner dimensions differ"):
            torch.ops.tegula.matmul(a, a)
        with pytest.raises(ValueError, match="weight has 64 elements"):
            torch.ops.tegula.rms_norm(x, torch.empty(64, dtype=x.dtype, device="cuda"), 1e-6)
        with pytest.raises(ValueError, match="only the last dim"):
            torch.ops.tegula.softmax(x, 0)
        tokens = torch.empty(4, 64, dtype=torch.float16, device="cuda")
        weight = torch.empty(30, 64, dtype=torch.float16, device="cuda")
        assert torch.ops.tegula.gemv(tokens, weight).shape == (4, 30)
        with pytest.raises(ValueError, match="gemv: x has 100 rows"):
            torch.ops.tegula.gemv(a, weight)
        packed = torch.empty(30, 32, dtype=torch.uint8, device="cuda")
        scales = torch.empty(30, 2, dtype=torch.float16, device="cuda")
        c = torch.ops.tegula.matmul_w4a16(a, packed, scales, None, 32)
        assert (c.shape, c.dtype, c.device.type) == ((100, 30), torch.float16, "cuda")
        with pytest.raises(ValueError, match="group_size must be one of"):
            torch.ops.tegula.matmul_w4a16(a, packed, scales, None, 48)
        scan = [torch.empty(t.shape, dtype=t.dtype, device="cuda")
                if isinstance(t, torch.Tensor) else t for t in _scan_operands()]
        out = torch.ops.tegula.selective_scan(*scan)
        assert (out.shape, out.dtype, out.device.type) == ((2, 3, 37), torch.float32, "cuda")
        short = torch.empty(2, 2, 37, dtype=torch.float32, device="cuda")  # 2 of 3 channels
        with pytest.raises(ValueError, match="selective_scan"):
            torch.ops.tegula.selective_scan(scan[0], short, *scan[2:])


def test_compile_fullgraph_traces_a_model_without_graph_breaks():
    def block(x, w, proj):
        h = torch.ops.tegula.rms_norm(x, w, 1e-6)
        return torch.ops.tegula.softmax(torch.ops.tegula.matmul(h, proj)) * 2

    x, w = _random((16, 64), torch.float16, 6), _random((64,), torch.float16, 7)
    proj = _random((64, 48), torch.float16, 8, 0.2)
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(block, fullgraph=True, backend=recording_backend)
    assert torch.equal(compiled(x, w, proj), block(x, w, proj))
    code = graphs[0].code
    for op in ("rms_norm", "matmul", "softmax"):
        assert f"torch.ops.tegula.{op}" in code
    assert torch._dynamo.explain(block)(x, w, proj).graph_break_count == 0
    aot = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(aot(x, w, proj), block(x, w, proj))


def _grads(fn, *inputs, upstream):
    leaves = [t.detach().clone().requires_grad_(t.dtype.is_floating_point) for t in inputs]
    fn(*leaves).backward(upstream)
    return [t.grad for t in leaves]


def test_row_op_gradients_match_torch_autograd():
    x, w = _random((6, 130), seed=11, scale=2.0), _random((130,), seed=12)
    g = _random((6, 130), seed=13)
    got = _grads(lambda x: torch.ops.tegula.softmax(x), x, upstream=g)
    want = _grads(lambda x: torch.softmax(x, -1), x.double(), upstream=g.double())
    assert torch.allclose(got[0].double(), want[0], rtol=1e-5, atol=1e-6)
    got = _grads(lambda x, w: torch.ops.tegula.rms_norm(x, w, 1e-5), x, w, upstream=g)
    want = _grads(lambda x, w: torch.nn.functional.rms_norm(x, (130,), w, 1e-5),
                  x.double(), w.double(), upstream=g.double())
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        assert torch.allclose(a.double(), b, rtol=1e-4, atol=1e-5)
    got = _grads(lambda x: torch.ops.tegula.copy(x), x.T, upstream=g.T)
    assert torch.equal(got[0], g.T)


def test_matmul_gradients_match_torch_autograd():
    a, b = _random((20, 36), torch.float16, 14), _random((36, 24), torch.float16, 15)
    g = _random((20, 24), torch.float16, 16)
    got = _grads(lambda a, b: torch.ops.tegula.matmul(a, b), a, b, upstream=g)
    gd, ad, bd = g.double(), a.double(), b.double()
    for grad, want, magnitude, k in ((got[0], gd @ bd.T, gd.abs() @ bd.abs().T, 24),
                                     (got[1], ad.T @ gd, ad.abs().T @ gd.abs(), 20)):
        # f32 accumulation over k terms, then one f16 rounding (half an ulp, 2^-11).
        bound = 2.0 ** -11 * want.abs() + k * 2.0 ** -24 * magnitude + 1e-7
        assert grad.dtype == torch.float16 and torch.all((grad.double() - want).abs() <= bound)


def test_a_compiled_training_step_differentiates_through_the_ops():
    def loss_fn(x, w):
        return torch.ops.tegula.softmax(torch.ops.tegula.rms_norm(x, w, 1e-6)).pow(2).sum()

    x, w = _random((8, 64), seed=17), _random((64,), seed=18)
    eager = _grads(loss_fn, x, w, upstream=torch.tensor(1.0))
    compiled = _grads(torch.compile(loss_fn, fullgraph=True, backend="aot_eager"), x, w,
                      upstream=torch.tensor(1.0))
    for a, b in zip(eager, compiled):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------- tg.torch_op

@tg.kernel(threads=64)
def scale_add(x: tg.Tensor[f32], y: tg.Tensor[f32], out: tg.Tensor[f32],
              ALPHA: tg.constexpr = 2.0, BM: tg.constexpr = 8, BN: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    a = tg.load(x.tile((BM, BN), (m, n)))
    b = tg.load(y.tile((BM, BN), (m, n)))
    tg.copy(a * ALPHA + b, out.tile((BM, BN), (m, n)))


@tg.kernel(threads=64)
def row_stats(x: tg.Tensor[f16], rows: int, total: tg.Tensor[f32], peak: tg.Tensor[f32],
              BN: tg.constexpr = 64):
    # One block per row: the row's sum and max (rows past `rows` write nothing).
    r = tg.block_id(0)
    with tg.if_(r < rows):
        t = tg.load(x.tile((1, BN), (r, 0)), fill=0.0).to(f32)
        tg.copy(tg.sum(t, 1), total.tile((1, 1), (r, 0)))
        tg.copy(tg.max(t, 1), peak.tile((1, 1), (r, 0)))


@tg.kernel(threads=64)
def dequantize(q: tg.Tensor[tg.i8], scale: tg.Tensor[tg.bf16], out: tg.Tensor[tg.bf16],
               BN: tg.constexpr = 64):
    # One row per block: out = q * scale (the scale one value per column).
    r = tg.block_id(0)
    values = tg.load(q.tile((1, BN), (r, 0))).to(f32)
    factors = tg.load(scale.tile((1, BN), (0, 0))).to(f32)
    tg.copy((values * factors).to(tg.bf16), out.tile((1, BN), (r, 0)))


def test_torch_op_with_int8_and_bf16_tensors_on_cpu():
    op = tg.torch_op(dequantize, out={"out": lambda q, scale: tuple(q.shape)},
                     grid=lambda q, scale: (q.shape[0],), name="tegula_test::dequantize")
    q = torch.randint(-128, 128, (7, 50), dtype=torch.int8)
    scale = _random((1, 50), torch.bfloat16, 21)
    out = op(q, scale)
    assert out.dtype == torch.bfloat16
    # One bf16 rounding of an exact f32 product: the same as torch's own.
    assert torch.equal(out, (q.float() * scale.float()).to(torch.bfloat16))


def _grid_2d(x, y):
    return (tg.cdiv(x.shape[0], 8), tg.cdiv(x.shape[1], 32))


_scale_add_op = tg.torch_op(scale_add, out={"out": "x"}, grid=_grid_2d,
                            name="tegula_test::scale_add", constexprs={"ALPHA": 3.0})


def test_torch_op_schema_and_cpu_result():
    assert str(_scale_add_op._opoverload._schema) == \
        "tegula_test::scale_add(Tensor x, Tensor y) -> Tensor"
    x, y = _random((37, 100), seed=1), _random((37, 100), seed=2)
    z = torch.ops.tegula_test.scale_add(x, y)
    assert torch.allclose(z, 3.0 * x + y, rtol=2 ** -22, atol=0)


def test_torch_op_scalars_two_outputs_and_shape_functions():
    op = tg.torch_op(row_stats, out={"total": lambda x, rows: (x.shape[0], 1),
                                     "peak": lambda x, rows: (x.shape[0], 1)},
                     grid=lambda x, rows: (x.shape[0],), name="tegula_test::row_stats")
    assert str(op._opoverload._schema) == \
        "tegula_test::row_stats(Tensor x, SymInt rows) -> (Tensor, Tensor)"
    x = _random((5, 50), torch.float16, 3)
    total, peak = op(x, 5)
    assert total.dtype == peak.dtype == torch.float32
    assert torch.allclose(total[:, 0], x.float().sum(1), rtol=1e-5, atol=1e-5)
    assert torch.equal(peak[:, 0], x.float().amax(1))
    torch.library.opcheck(op, (x, 5))


def test_torch_op_fake_opcheck_and_compile():
    x, y = _random((20, 70), seed=3), _random((20, 70), seed=4)
    torch.library.opcheck(_scale_add_op, (x, y))
    f = torch.compile(lambda x, y: _scale_add_op(x, y).relu(), fullgraph=True,
                      backend="aot_eager")
    assert torch.equal(f(x, y), (3.0 * x + y).relu())
    with FakeTensorMode():
        fx = torch.empty(1000, 4096, device="cuda")
        out = _scale_add_op(fx, fx)
        assert (out.shape, out.device.type) == ((1000, 4096), "cuda")


def test_torch_op_reports_mistakes_clearly():
    with pytest.raises(TegulaError, match="out names 'z', which is not a tensor parameter"):
        tg.torch_op(scale_add, out={"z": "x"}, grid=(1,))
    with pytest.raises(TegulaError, match="is not a tensor input"):
        tg.torch_op(scale_add, out={"out": "w"}, grid=(1,))
    with pytest.raises(TegulaError, match="'BK' is not a parameter"):
        tg.torch_op(scale_add, out={"out": "x"}, grid=(1,), constexprs={"BK": 3})
    with pytest.raises(TegulaError, match="namespace::op"):
        tg.torch_op(scale_add, out={"out": "x"}, grid=(1,), name="no_namespace")
    with pytest.raises(TegulaError, match="already registered"):
        tg.torch_op(scale_add, out={"out": "x"}, grid=(1,), name="tegula_test::scale_add")
    with pytest.raises(TegulaError, match=r"y must be a 2-D torch.float32 tensor .* got 2-D "
                                          r"torch.float16"):
        _scale_add_op(_random((4, 4)), _random((4, 4), torch.float16))
    bad_rank = tg.torch_op(scale_add, out={"out": lambda x, y: (x.numel(),)}, grid=(1,),
                           name="tegula_test::scale_add_bad_rank")
    with pytest.raises(TegulaError, match=r"gave shape \(16,\), but the kernel declares .*rank 2"):
        bad_rank(_random((4, 4)), _random((4, 4)))


# ------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("name, args", [
    ("matmul", lambda: (_random((300, 200), torch.float16), _random((200, 130), torch.float16))),
    ("rms_norm", lambda: (_random((6, 1000), torch.bfloat16), _random((1000,), torch.bfloat16),
                          1e-6)),
    ("softmax", lambda: (_random((7, 3000), torch.float16, scale=3.0),)),
    ("copy", lambda: (_random((9, 333), torch.float16),)),
    ("gemv", lambda: (_random((3, 512), torch.float16), _random((256, 512), torch.float16))),
    ("matmul_w4a16", lambda: _w4a16_operands(16, 256, 512, 128, False, 5) + (128,)),
    ("matmul_w4a16", lambda: _w4a16_fragment_operands(16, 256, 512, 128, False, 5) + (128,)),
    ("attention_decode", lambda: _decode_operands(4, paged=True)),
    ("selective_scan", lambda: _scan_operands(6, torch.bfloat16)),
])
def test_opcheck_on_cuda(name, args):
    cuda_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args())
    torch.library.opcheck(getattr(torch.ops.tegula, name).default, cuda_args)


@pytest.mark.gpu
def test_compiled_model_and_cuda_graph_on_gpu():
    x = _random((64, 512), torch.float16, 1).cuda()
    w = _random((512,), torch.float16, 2).cuda()
    proj = _random((512, 256), torch.float16, 3, 0.05).cuda()

    def block(x):
        return torch.ops.tegula.softmax(torch.ops.tegula.matmul(
            torch.ops.tegula.rms_norm(x, w, 1e-6), proj))

    ref = torch.softmax((torch.nn.functional.rms_norm(x.float(), (512,), w.float(), 1e-6)
                         @ proj.float()), -1)
    eager = block(x)  # also tunes every op outside the capture below
    compiled = torch.compile(block, fullgraph=True)(x)
    for y in (eager, compiled):
        assert torch.allclose(y.float(), ref, rtol=2e-2, atol=1e-3)
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    with torch.cuda.graph(graph):
        static_y = block(static_x)
    static_x.copy_(_random((64, 512), torch.float16, 9).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, block(static_x))


@pytest.mark.gpu
def test_torch_op_on_cuda():
    x, y = _random((37, 100), seed=1).cuda(), _random((37, 100), seed=2).cuda()
    assert torch.allclose(_scale_add_op(x, y), 3.0 * x + y, rtol=2 ** -22, atol=0)
    torch.library.opcheck(_scale_add_op, (x, y))
