"""`tg.torch_op(..., backward=...)`: a user's kernel op with an autograd formula, the
backward another kernel's op or a Python function. On CPU the ops run in the emulator, so
gradients, gradcheck, opcheck (its autograd and AOT checks) and torch.compile are checked
end to end; the CUDA run is marked `gpu`."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tegula as tg  # noqa: E402
from tegula import f32  # noqa: E402
from tegula.errors import TegulaError  # noqa: E402

BM, BN = 8, 32  # tiles that do not divide the test shapes


@tg.kernel(threads=64)
def mul(x: tg.Tensor[f32], y: tg.Tensor[f32], out: tg.Tensor[f32]):
    m, n = tg.block_id(0), tg.block_id(1)
    a = tg.load(x.tile((BM, BN), (m, n)))
    b = tg.load(y.tile((BM, BN), (m, n)))
    tg.copy(a * b, out.tile((BM, BN), (m, n)))


@tg.kernel(threads=64)
def mul_backward(x: tg.Tensor[f32], y: tg.Tensor[f32], grad_out: tg.Tensor[f32],
                 grad_x: tg.Tensor[f32], grad_y: tg.Tensor[f32]):
    m, n = tg.block_id(0), tg.block_id(1)
    g = tg.load(grad_out.tile((BM, BN), (m, n)))
    tg.copy(g * tg.load(y.tile((BM, BN), (m, n))), grad_x.tile((BM, BN), (m, n)))
    tg.copy(g * tg.load(x.tile((BM, BN), (m, n))), grad_y.tile((BM, BN), (m, n)))


@tg.kernel(threads=64)
def exp_kernel(x: tg.Tensor[f32], out: tg.Tensor[f32]):
    m, n = tg.block_id(0), tg.block_id(1)
    tg.copy(tg.exp(tg.load(x.tile((BM, BN), (m, n)))), out.tile((BM, BN), (m, n)))


@tg.kernel(threads=64)
def scaled_rows(x: tg.Tensor[f32], rows: int, out: tg.Tensor[f32]):
    # out = x * 2 on the first `rows` rows, 0 below (an int input next to a tensor).
    m, n = tg.block_id(0), tg.block_id(1)
    a = tg.load(x.tile((BM, BN), (m, n)))
    tg.copy(tg.where(tg.indices((BM, BN), 0, m * BM) < rows, a * 2.0, a * 0.0),
            out.tile((BM, BN), (m, n)))


def grid(x, *_):
    return (tg.cdiv(x.shape[0], BM), tg.cdiv(x.shape[1], BN))


mul_op = tg.torch_op(mul, out={"out": "x"}, grid=grid, name="tegula_test_bwd::mul",
                     backward=tg.torch_op(mul_backward, grid=grid,
                                          out={"grad_x": "x", "grad_y": "y"},
                                          name="tegula_test_bwd::mul_backward"))
exp_op = tg.torch_op(exp_kernel, out={"out": "x"}, grid=grid, name="tegula_test_bwd::exp",
                     backward=lambda out, grad_out: grad_out * out)


def _random(shape, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) + 0.25).requires_grad_(requires_grad)


def test_a_backward_kernel_gives_the_product_rule():
    x, y = _random((37, 100), 1), _random((37, 100), 2)
    g = _random((37, 100), 3, requires_grad=False)
    out = mul_op(x, y)
    assert torch.equal(out, x.detach() * y.detach())
    out.backward(g)
    assert torch.equal(x.grad, g * y.detach()) and torch.equal(y.grad, g * x.detach())


def test_only_the_gradients_asked_for_are_returned():
    x, y = _random((9, 40), 4), _random((9, 40), 5, requires_grad=False)
    mul_op(x, y).sum().backward()  # grad_out expanded (stride 0): made contiguous
    assert torch.equal(x.grad, y.expand(9, 40)) and y.grad is None


def test_a_python_backward_reads_the_saved_output_and_only_it_is_saved():
    x = _random((13, 33), 6)
    g = _random((13, 33), 7, requires_grad=False)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t,
                                                  lambda t: t):
        out = exp_op(x)
    assert len(packed) == 1 and torch.equal(packed[0], out)  # `out` only, not x
    out.backward(g)
    assert torch.equal(x.grad, g * out.detach())
    assert torch.allclose(out, x.detach().exp(), rtol=2e-6, atol=0)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_gradcheck_and_opcheck_on_cpu():
    """Finite differences in f32 (loose tolerances, fast mode: a few emulator runs), and
    opcheck's autograd-registration and AOT-dispatch (forward and backward traced with
    fake tensors, then compared with eager) checks."""
    x, y = _random((5, 7), 8), _random((5, 7), 9)
    assert torch.autograd.gradcheck(mul_op, (x, y), eps=1e-2, atol=1e-2, rtol=1e-2,
                                    fast_mode=True)
    assert torch.autograd.gradcheck(exp_op, (x,), eps=1e-3, atol=1e-2, rtol=1e-2,
                                    fast_mode=True)
    torch.library.opcheck(mul_op, (x, y))
    torch.library.opcheck(exp_op, (x,))


def test_compiled_training_step_differentiates_through_the_op():
    x, y = _random((11, 50), 10), _random((11, 50), 11)
    step = torch.compile(lambda x, y: exp_op(mul_op(x, y)).sum(), fullgraph=True,
                         backend="aot_eager")
    step(x, y).backward()
    xr, yr = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    (xr * yr).exp().sum().backward()
    assert torch.allclose(x.grad, xr.grad, rtol=1e-5, atol=1e-6)
    assert torch.allclose(y.grad, yr.grad, rtol=1e-5, atol=1e-6)


def test_int_inputs_and_dict_or_tuple_results():
    def as_dict(x, rows, grad_out):
        keep = (torch.arange(x.shape[0]) < rows).float()[:, None]
        return {"x": grad_out * 2 * keep}

    def as_tuple(x, rows, grad_out):
        return (as_dict(x, rows, grad_out)["x"], None)

    for name, backward in (("dict", as_dict), ("tuple", as_tuple)):
        op = tg.torch_op(scaled_rows, out={"out": "x"}, grid=grid, backward=backward,
                         name=f"tegula_test_bwd::scaled_rows_{name}")
        x = _random((19, 40), 12)
        op(x, 11).backward(torch.ones(19, 40))
        assert torch.equal(x.grad[:11], torch.full((11, 40), 2.0)), name
        assert torch.equal(x.grad[11:], torch.zeros(8, 40)), name


def test_backward_mistakes_are_named():
    def make(backward, name):
        return tg.torch_op(mul, out={"out": "x"}, grid=grid, backward=backward,
                           name=f"tegula_test_bwd::{name}")

    with pytest.raises(TegulaError, match=r"reads 'grad_y', which is neither .*available: "
                                          r"x, y, out, grad_out"):
        make(lambda x, grad_y: x, "m1")
    with pytest.raises(TegulaError, match=r"takes \*grads; it is called by name"):
        make(lambda *grads: grads, "m2")
    with pytest.raises(TegulaError, match="backward must be an op made by tg.torch_op"):
        make(3, "m3")
    with pytest.raises(TegulaError, match=r"output 'out'; its outputs must be named grad_"):
        make(mul_op, "m4")  # mul_op's output is `out`, not grad_x / grad_y
    x, y = _random((6, 8), 13), _random((6, 8), 14)
    for backward, message in (
            (lambda x, y, grad_out: (grad_out,), r"returned 1 gradients; the op has 2 inputs"),
            (lambda grad_out: {"z": grad_out}, r"gradients of \['z'\], which are not inputs"),
            (lambda grad_out: grad_out, r"returned one value; the op has 2 tensor inputs"),
            (lambda grad_out: {"x": grad_out[:, :3]},
             r"gradient of 'x' shaped \(6, 3\); x has shape \(6, 8\)")):
        op = make(backward, f"m{len(message)}_{abs(hash(message)) % 1000}")
        with pytest.raises(TegulaError, match=message):
            op(x, y).backward(torch.ones(6, 8))


def _cuda_inputs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = _random((37, 100), 1, requires_grad=False).cuda().requires_grad_()
    y = _random((37, 100), 2, requires_grad=False).cuda().requires_grad_()
    return x, y, _random((37, 100), 3, requires_grad=False).cuda()


@pytest.mark.gpu
def test_backward_kernel_on_cuda():
    x, y, g = _cuda_inputs()
    out = mul_op(x, y)
    assert torch.equal(out, x.detach() * y.detach())
    out.backward(g)  # on the autograd engine's CUDA thread
    assert torch.equal(x.grad, g * y.detach()) and torch.equal(y.grad, g * x.detach())


@pytest.mark.gpu
def test_python_backward_on_cuda():
    x, _, g = _cuda_inputs()
    out = exp_op(x)
    out.backward(g)
    assert torch.equal(x.grad, g * out.detach())
    assert torch.allclose(out, x.detach().exp(), rtol=1e-5, atol=0)


@pytest.mark.gpu
def test_opcheck_with_gradients_on_cuda():
    x, y, _ = _cuda_inputs()
    torch.library.opcheck(mul_op, (x, y))
    torch.library.opcheck(exp_op, (x,))


def test_an_int_input_read_by_the_backward_under_dynamic_compile():
    """With dynamic shapes the int input reaches setup_context as a SymInt: kept as it is
    (save_for_backward takes tensors only)."""
    def backward(x, rows, grad_out):
        keep = (torch.arange(x.shape[0]) < rows).to(grad_out.dtype)[:, None]
        return {"x": grad_out * 2 * keep}

    op = tg.torch_op(scaled_rows, out={"out": "x"}, grid=grid, backward=backward,
                     name="tegula_test_bwd::scaled_rows_dynamic")
    step = torch.compile(lambda x, rows: op(x, rows).sum(), dynamic=True, fullgraph=True,
                         backend="aot_eager")
    for rows, n in ((5, 9), (7, 13)):
        x = _random((n, 40), 20 + rows)
        step(x, rows).backward()
        assert torch.equal(x.grad[:rows], torch.full((rows, 40), 2.0))
        assert torch.equal(x.grad[rows:], torch.zeros(n - rows, 40))
