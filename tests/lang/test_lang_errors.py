"""Every misuse of the language is a TraceError naming the op and the user's line."""
from __future__ import annotations

import os
import sys

import pytest

import tegula as tg
from tegula import f16, f32, i8, i32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from source_lines import marked_line  # noqa: E402


def line_of(marker: str) -> int:
    return marked_line(__file__, marker)


def expect(kernel, marker: str, *words: str, **constexprs) -> str:
    """Tracing `kernel` fails at the line marked `marker` with all `words` in the message."""
    with pytest.raises(tg.TraceError) as info:
        kernel.trace(**constexprs)
    text = str(info.value)
    assert f"{__file__}:{line_of(marker)}" in text, text
    for w in words:
        assert w in text, (w, text)
    assert info.value.loc.lineno == line_of(marker)
    return text


def kernel2(body):
    """A kernel over x (f16), y (f32), z (f16, rank 3) running `body(x, y, z)`."""
    @tg.kernel(threads=128)
    def k(x: tg.Tensor[f16], y: tg.Tensor[f32], z: tg.Tensor[f16, 3]):
        body(x, y, z)
    return k


def test_copy_shape_mismatch():
    def body(x, y, z):
        s = tg.shared((64, 32), f16)
        tg.copy(x.tile((64, 16), (0, 0)), s)  # @copy-shape
    text = expect(kernel2(body), "@copy-shape", "tg.copy", "shapes differ", "global<64x16, f16>",
                  "shared<64x32, f16>")
    assert "tg.copy(x.tile((64, 16), (0, 0)), s)" in text


def test_copy_dtype_mismatch():
    def body(x, y, z):
        r = tg.zeros((64, 32), f32)
        tg.copy(r, x.tile((64, 32), (0, 0)))  # @copy-dtype
    expect(kernel2(body), "@copy-dtype", "tg.copy", "element types differ", ".to(f16)")


def test_copy_global_to_global():
    def body(x, y, z):
        tg.copy(x.tile((8, 8), (0, 0)), x.tile((8, 8), (1, 0)))  # @g2g
    expect(kernel2(body), "@g2g", "tg.copy", "global", "directly")


def test_elementwise_shapes_and_types():
    def shapes(x, y, z):
        a, b = tg.zeros((8, 4), f32), tg.zeros((4, 8), f32)
        a + b  # @bcast
    expect(kernel2(shapes), "@bcast", "+", "do not broadcast", "register<8x4, f32>")

    def types(x, y, z):
        a, b = tg.zeros((8, 4), f32), tg.zeros((8, 4), f16)
        tg.maximum(a, b)  # @ew-dtype
    expect(kernel2(types), "@ew-dtype", "tg.maximum", "different element types")

    def ranks(x, y, z):
        tg.zeros((8, 4), f32) * tg.zeros((8,), f32)  # @ew-rank
    expect(kernel2(ranks), "@ew-rank", "*", "do not broadcast", "(1, 8)", "t[:, None]")

    def math_on_int(x, y, z):
        tg.exp(tg.zeros((8, 4), i32))  # @exp-int
    expect(kernel2(math_on_int), "@exp-int", "tg.exp", "floating-point")


def test_elementwise_on_memory_tiles_explains_loading():
    def body(x, y, z):
        s = tg.shared((8, 8), f16)
        tg.exp(s)  # @ew-shared
    expect(kernel2(body), "@ew-shared", "tg.exp", "shared memory", "tg.load")


def test_gemm_ranks_shapes_types_scopes():
    def rank(x, y, z):
        acc = tg.zeros((16, 16), f32)
        tg.gemm(acc, tg.shared((16, 8, 2), f16), tg.shared((16, 8), f16))  # @gemm-rank
    expect(kernel2(rank), "@gemm-rank", "tg.gemm", "rank 2", "shared<16x8x2, f16>")

    def shape(x, y, z):
        acc = tg.zeros((16, 16), f32)
        tg.gemm(acc, tg.shared((16, 8), f16), tg.shared((16, 16), f16))  # @gemm-shape
    expect(kernel2(shape), "@gemm-shape", "tg.gemm", "c[M, N] += a[M, K] @ b[N, K].T")

    def acc_type(x, y, z):
        acc = tg.zeros((16, 16), f32)
        tg.gemm(acc, tg.shared((16, 32), i8), tg.shared((16, 32), i8))  # @gemm-acc
    expect(kernel2(acc_type), "@gemm-acc", "tg.gemm", "accumulates in i32")

    def mixed(x, y, z):
        acc = tg.zeros((16, 16), f32)
        tg.gemm(acc, tg.shared((16, 32), f16), tg.shared((16, 32), i8))  # @gemm-mixed
    expect(kernel2(mixed), "@gemm-mixed", "tg.gemm", "no matrix instruction")

    def glob(x, y, z):
        acc = tg.zeros((16, 16), f32)
        tg.gemm(acc, x.tile((16, 16), (0, 0)), tg.shared((16, 16), f16))  # @gemm-global
    expect(kernel2(glob), "@gemm-global", "tg.gemm", "global memory", "operand a")

    def uninit(x, y, z):
        acc = tg.register((16, 16), f32)
        tg.gemm(acc, tg.shared((16, 16), f16), tg.shared((16, 16), f16))  # @gemm-uninit
    expect(kernel2(uninit), "@gemm-uninit", "tg.gemm", "read before anything wrote it")


def test_python_if_on_runtime_values():
    def scalar_if(x, y, z):
        if tg.block_id(0):  # @py-if
            pass
    expect(kernel2(scalar_if), "@py-if", "tg.if_")

    def cond_and(x, y, z):
        k = tg.block_id(0)
        with tg.if_(k > 1 and k < 4):  # @py-and
            pass
    expect(kernel2(cond_and), "@py-and", "&")

    def python_range(x, y, z):
        for _ in range(x.shape[0]):  # @py-range
            pass
    expect(kernel2(python_range), "@py-range", "x.shape[0]")

    def tile_if(x, y, z):
        if tg.zeros((4, 4), f32) > 0:  # @tile-if
            pass
    expect(kernel2(tile_if), "@tile-if", "tg.where")


def test_control_flow_misuse():
    def loop_break(x, y, z):
        for _ in tg.range(4):  # @break
            break
    expect(kernel2(loop_break), "@break", "tg.range", "break")

    def lonely_else(x, y, z):
        with tg.else_():  # @else
            pass
    expect(kernel2(lonely_else), "@else", "tg.else_", "directly follow")

    def tile_cond(x, y, z):
        with tg.if_(tg.zeros((4, 4), f32) > 0):  # @if-tile
            pass
    expect(kernel2(tile_cond), "@if-tile", "tg.if_", "tg.where")

    def static_cond(x, y, z):
        with tg.if_(3 > 2):  # @if-static
            pass
    expect(kernel2(static_cond), "@if-static", "tg.if_", "Python `if`")

    def bad_step(x, y, z):  # a kernel scalar is a valid step of tg.range, a float is not
        for _ in tg.range(0, 8, 1.5):  # @step
            pass
    expect(kernel2(bad_step), "@step", "tg.range", "step")


def test_shape_and_buffer_misuse():
    def symbolic_shape(x, y, z):
        tg.zeros((x.shape[0], 4), f32)  # @sym-shape
    expect(kernel2(symbolic_shape), "@sym-shape", "tg.register", "known at trace time")

    def stageless(x, y, z):
        s = tg.shared((8, 8), f16, stages=2)
        tg.copy(x.tile((8, 8), (0, 0)), s)  # @stageless
    expect(kernel2(stageless), "@stageless", "tg.copy", "pick one stage")

    def wrong_tile_rank(x, y, z):
        z.tile((8, 8), (0, 0))  # @tile-rank
    expect(kernel2(wrong_tile_rank), "@tile-rank", "tile()", "3 dims")

    def max_of_two(x, y, z):
        a = tg.zeros((4, 4), f32)
        tg.max(a, a)  # @max2
    expect(kernel2(max_of_two), "@max2", "tg.max", "tg.maximum")

    def load_symbolic(x, y, z):
        tg.load(x.tile((8, 8), (0, None)))  # @load-sym
    expect(kernel2(load_symbolic), "@load-sym", "tg.load", "run-time extent")

    def index_register(x, y, z):
        tg.zeros((4, 4), f32)[0]  # @reg-index
    expect(kernel2(index_register), "@reg-index", "register[...]")

    def assign_mismatch(x, y, z):
        tg.zeros((4, 4), f32).assign(tg.zeros((4, 4), f16))  # @assign
    expect(kernel2(assign_mismatch), "@assign", "assign()", "must match")


def test_signature_errors_point_at_the_definition():
    with pytest.raises(tg.TraceError) as info:
        @tg.kernel  # @ann
        def k(x: float):
            pass
    assert f"{__file__}:{line_of('@ann')}" in str(info.value)
    assert "parameter 'x'" in str(info.value) and "tg.constexpr" in str(info.value)

    with pytest.raises(tg.TraceError, match="needs its element type"):
        @tg.kernel
        def k2(x: tg.Tensor):
            pass

    with pytest.raises(tg.TraceError, match="no annotation"):
        @tg.kernel
        def k3(x):
            pass

    with pytest.raises(tg.TraceError, match="multiple of 32"):
        @tg.kernel(threads=100)
        def k4(x: tg.Tensor[f16]):
            pass


def test_constexpr_errors_point_at_the_trace_call():
    @tg.kernel
    def k(x: tg.Tensor[f16], n: int, BM: tg.constexpr, BN: tg.constexpr = 4):
        pass

    with pytest.raises(tg.TraceError) as info:
        k.trace(BM=1, BX=3)  # @unknown-cx
    text = str(info.value)
    assert "'BX'" in text and "BM, BN" in text and f":{line_of('@unknown-cx')}" in text
    with pytest.raises(tg.TraceError, match="'n' is a run-time parameter"):
        k.trace(BM=1, n=3)
    with pytest.raises(tg.TraceError, match="'BM' has no default"):
        k.trace()
    assert k.trace(BM=2).constexprs == {"BM": 2, "BN": 4}


def test_returning_a_value_and_using_ops_outside_kernels():
    @tg.kernel
    def k(x: tg.Tensor[f16]):
        return x

    with pytest.raises(tg.TraceError, match="returns nothing"):
        k.trace()
    with pytest.raises(tg.TraceError) as info:
        tg.zeros((4, 4), f32)  # @outside
    assert "only be used inside" in str(info.value)
    assert f":{line_of('@outside')}" in str(info.value)
    with pytest.raises(tg.TegulaError, match=r"k\[grid\]"):
        k(1)


def test_user_python_errors_keep_their_own_type():
    def body(x, y, z):
        raise KeyError("mine")
    with pytest.raises(KeyError, match="mine"):
        kernel2(body).trace()


def test_internal_failures_are_reported_at_the_users_line(monkeypatch):
    import tegula.lang.ops as lang_ops

    # A failure raised inside tegula's own frames (calling None) stands in for a bug.
    monkeypatch.setattr(lang_ops, "same_shape", None)

    def body(x, y, z):
        tg.copy(x.tile((8, 8), (0, 0)), tg.shared((8, 8), f16))  # @internal
    text = expect(kernel2(body), "@internal", "internal error", "TypeError")
    assert "tegula bug" in text


def test_kernels_without_string_annotations():
    namespace: dict = {}
    exec("import tegula as tg\n"
         "from tegula import f16, f32\n"
         "@tg.kernel(threads=32)\n"
         "def k(x: tg.Tensor[f16, 1], n: int, B: tg.constexpr = 16):\n"
         "    tg.copy(tg.load(x.tile((B,), (n,))), x.tile((B,), (0,)))\n", namespace)
    t = namespace["k"].trace(B=8)
    assert t.args[0].rank == 1 and t.scalar_args == ["n"]
    assert t.body[0].dst.shape == (8,)
    with pytest.raises(tg.TraceError, match="rank"):
        tg.Tensor[f16, 0]
    with pytest.raises(tg.TraceError, match="element type"):
        tg.Tensor["f16"]


@pytest.mark.parametrize("name", ["tid", "bid_x", "i0", "r3", "s1", "c0_1", "inv2",
                                  "x_shape0", "y_stride1", "tg_grid_x", "s0_saddr"])
def test_parameter_names_the_compiler_uses_are_refused(name):
    """A scalar parameter named `tid` was silently the thread index in the emulator (the
    machine binds `tid` after the arguments), one named `i0` was shadowed by the first
    loop counter in CUDA; every name the compiler gives its own values is refused."""
    namespace = {"tg": tg, "f32": f32}
    exec(f"def k(x: tg.Tensor[f32], {name}: int):\n    pass\n", namespace)
    with pytest.raises(tg.TraceError, match=f"parameter '{name}': the compiler names"):
        tg.kernel(threads=32)(namespace["k"])


@pytest.mark.parametrize("name", ["do", "int", "float", "switch", "threadIdx"])
def test_parameter_names_cuda_reserves_are_refused(name):
    """`do` (dO, an attention gradient) emulated fine and failed only when codegen met it:
    C++ keywords and CUDA's built-in names are refused when the kernel is defined."""
    namespace = {"tg": tg, "f32": f32}
    exec(f"def k(x: tg.Tensor[f32], {name}: tg.Tensor[f32]):\n    pass\n", namespace)
    with pytest.raises(tg.TraceError, match=f"parameter '{name}': a C\\+\\+ keyword"):
        tg.kernel(threads=32)(namespace["k"])


def test_ordinary_parameter_names_are_kept():
    namespace = {"tg": tg, "f32": f32}
    exec("def k(x: tg.Tensor[f32], n: int, x1: tg.Tensor[f32], shape0: int, rows: int, "
         "i: int, s: int):\n    pass\n", namespace)
    assert [p.name for p in tg.kernel(threads=32)(namespace["k"]).params] == \
        ["x", "n", "x1", "shape0", "rows", "i", "s"]
