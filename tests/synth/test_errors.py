"""Bad kernels fail with a tegula error (a TegulaError subclass) that names the op, the
tensors, their shapes/layouts, and the user's source line(s) — from the language at trace
time (TraceError), from synthesis (SynthesisError), or for resources (ResourceError)."""
from __future__ import annotations

import re

import pytest

import tegula as tg
from tegula import bf16, f8e4m3, f16, f32, i8
from tegula.build import build
from tegula.errors import ResourceError, SynthesisError, TegulaError, TraceError
from tegula.layout.cute import Layout


# A tiled MMA fragment layout in CuTe notation: ((thread modes),(value modes)):(strides).
TV_LAYOUT = re.compile(r"\(\(\(4,8\),\([0-9,]+\)\),\([0-9,()]+\)\):\(\([0-9,()]+\)\)")


def line_of(marker: str) -> int:
    """The line of this file that carries the comment `# marker`."""
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return n
    raise AssertionError(marker)


def expect(kernel, error: type, marker: str, *words: str, also: tuple = (),
           target: str = "sm_90a", **constexprs) -> str:
    """Building `kernel` for `target` raises `error` at the line marked `marker` (file:line
    in the message), mentions the lines marked in `also`, and contains every word in
    `words`."""
    with pytest.raises(TegulaError) as info:
        build(kernel, constexprs, target=target)
    assert isinstance(info.value, error), (type(info.value), str(info.value))
    text = str(info.value)
    assert f"{__file__}:{line_of(marker)}" in text, text
    assert info.value.loc is not None and info.value.loc.lineno == line_of(marker)
    for other in also:
        n = line_of(other)
        assert f"{__file__}:{n}" in text or f"line {n}" in text, (other, text)
    for w in words:
        assert w in text, (w, text)
    return text


# --------------------------------------------------------------------------- the language

def test_copy_shape_mismatch():
    @tg.kernel(threads=128)
    def k(x: tg.Tensor[f16]):
        s = tg.shared((64, 32), f16)
        tg.copy(x.tile((64, 16), (0, 0)), s)  # @copy-shape
    expect(k, TraceError, "@copy-shape", "tg.copy", "shapes differ", "global<64x16, f16>",
           "shared<64x32, f16>")


def test_copy_dtype_mismatch():
    @tg.kernel(threads=128)
    def k(x: tg.Tensor[f16]):
        r = tg.zeros((64, 32), f32)
        tg.copy(r, x.tile((64, 32), (0, 0)))  # @copy-dtype
    expect(k, TraceError, "@copy-dtype", "tg.copy", "element types differ",
           "register<64x32, f32>", "global<64x32, f16>", ".to(f16)")


def test_elementwise_shape_mismatch():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        x = tg.load(a.tile((64, 64), (0, 0)))
        y = tg.load(a.tile((64, 32), (0, 0)))
        tg.copy(x + y, c.tile((64, 64), (0, 0)))  # @ew-shape
    expect(k, TraceError, "@ew-shape", "+", "register<64x64, f32>", "register<64x32, f32>",
           "broadcast")


def test_elementwise_dtype_mismatch():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], b: tg.Tensor[f16], c: tg.Tensor[f32]):
        x = tg.load(a.tile((64, 64), (0, 0)))
        y = tg.load(b.tile((64, 64), (0, 0)))
        tg.copy(x * y, c.tile((64, 64), (0, 0)))  # @ew-dtype
    expect(k, TraceError, "@ew-dtype", "*", "register<64x64, f32>", "register<64x64, f16>",
           "element types")


# --------------------------------------------------------------------------- gemm operands

def test_gemm_operand_of_wrong_rank():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16, 1], b: tg.Tensor[f16]):
        acc = tg.zeros((64, 64), f32)
        ra = tg.load(a.tile((64,), (0,)))
        rb = tg.load(b.tile((64, 32), (0, 0)))
        tg.gemm(acc, ra, rb)  # @gemm-rank
    expect(k, TraceError, "@gemm-rank", "tg.gemm", "operand a", "register<64, f16>", "rank 2")


def test_gemm_operands_of_wrong_shape():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16], b: tg.Tensor[f16]):
        acc = tg.zeros((64, 64), f32)
        sa, sb = tg.shared((64, 32), f16), tg.shared((64, 16), f16)
        tg.copy(a.tile((64, 32), (0, 0)), sa)
        tg.copy(b.tile((64, 16), (0, 0)), sb)
        tg.gemm(acc, sa, sb)  # @gemm-shape
    expect(k, TraceError, "@gemm-shape", "tg.gemm", "c[M, N] += a[M, K] @ b[N, K].T",
           "register<64x64, f32>", "shared<64x32, f16>", "shared<64x16, f16>")


def test_gemm_operands_of_different_types():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16], b: tg.Tensor[i8]):
        acc = tg.zeros((64, 64), f32)
        sa, sb = tg.shared((64, 32), f16), tg.shared((64, 32), i8)
        tg.copy(a.tile((64, 32), (0, 0)), sa)
        tg.copy(b.tile((64, 32), (0, 0)), sb)
        tg.gemm(acc, sa, sb)  # @gemm-dtype
    expect(k, TraceError, "@gemm-dtype", "tg.gemm", "f16 by i8", "shared<64x32, f16>",
           "shared<64x32, i8>")


def test_gemm_accumulator_of_wrong_type():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[bf16], b: tg.Tensor[bf16]):
        acc = tg.zeros((64, 64), f16)
        sa, sb = tg.shared((64, 32), bf16), tg.shared((64, 32), bf16)
        tg.copy(a.tile((64, 32), (0, 0)), sa)
        tg.copy(b.tile((64, 32), (0, 0)), sb)
        tg.gemm(acc, sa, sb)  # @gemm-acc
    expect(k, TraceError, "@gemm-acc", "tg.gemm", "accumulates in f32", "register<64x64, f16>")


def test_gemm_types_no_mma_instruction_takes():
    """f16 x i8: no catalogue entry multiplies it on any target, so tracing refuses it."""
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16], b: tg.Tensor[tg.i8]):
        acc = tg.zeros((64, 64), f32)
        ra = tg.load(a.tile((64, 32), (0, 0)))
        rb = tg.load(b.tile((64, 32), (0, 0)))
        tg.gemm(acc, ra, rb)  # @gemm-mixed
    expect(k, TraceError, "@gemm-mixed", "tg.gemm", "no matrix instruction multiplies f16 by i8",
           "register<64x32, f16>")


def test_gemm_f32_operands_wgmma_cannot_take():
    """f32 x f32 multiplies only as sm_90a's tf32 wgmma, which reads shared tiles: from
    registers, synthesis says so at the gemm's line."""
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], b: tg.Tensor[f32]):
        acc = tg.zeros((64, 64), f32)
        ra = tg.load(a.tile((64, 32), (0, 0)))
        rb = tg.load(b.tile((64, 32), (0, 0)))
        tg.gemm(acc, ra, rb)  # @gemm-f32
    expect(k, SynthesisError, "@gemm-f32", "f32 x f32 into f32", "only through wgmma",
           "does not fit here", "register<64x32, f32>")


def test_gemm_types_no_mma_on_the_target():
    """f8 x f8: catalogue entries exist from sm_89; building for sm_80 names the target."""
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3]):
        acc = tg.zeros((64, 64), f32)
        ra = tg.load(a.tile((64, 32), (0, 0)))
        rb = tg.load(b.tile((64, 32), (0, 0)))
        tg.gemm(acc, ra, rb)  # @gemm-f8
    expect(k, SynthesisError, "@gemm-f8", "gemm", "no MMA instruction", "f8e4m3 by f8e4m3",
           "sm_80", "register<64x32, f8e4m3>", "register<64x64, f32>", target="sm_80")


def test_gemm_tiles_no_mma_fits():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16], b: tg.Tensor[f16]):
        acc = tg.zeros((48, 40), f32)
        ra = tg.load(a.tile((48, 24), (0, 0)))
        rb = tg.load(b.tile((40, 24), (0, 0)))
        tg.gemm(acc, ra, rb)  # @gemm-fit
    expect(k, SynthesisError, "@gemm-fit", "gemm", "K=24", "48x40", "mma.m16n8k16")


# --------------------------------------------------------------------------- resources

def test_shared_memory_over_the_target_limit():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32]):
        s = tg.shared((256, 256), f32, stages=4)  # @smem
        tg.copy(a.tile((256, 256), (0, 0)), s[0])
    text = expect(k, ResourceError, "@smem", "%s0: shared<256x256, f32> x4 stages",
                  "1048576", "232448", "sm_90a")
    assert "fewer stages" in text


# --------------------------------------------------------------------------- pinned layouts

def test_pinned_layout_for_the_wrong_number_of_threads():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        r = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((64, 64), (1, 64)))  # @pin-threads
        tg.copy(r, c.tile((64, 64), (0, 0)))
    expect(k, SynthesisError, "@pin-threads", "(64,64):(1,64)", "register<64x64, f32>",
           "64 threads", "128 threads")


def test_pinned_layout_that_does_not_cover_the_tile():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        r = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 16), (1, 128)))  # @pin-cover
        tg.copy(r, c.tile((64, 64), (0, 0)))
    expect(k, SynthesisError, "@pin-cover", "(128,16):(1,128)", "register<64x64, f32>",
           "4096 elements", "covers 2048")


def test_pinned_accumulator_that_the_mma_cannot_use():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
        acc = tg.zeros((64, 64), f32, layout=Layout((128, 32), (1, 128)))  # @pin-acc
        sa, sb = tg.shared((64, 32), f16), tg.shared((64, 32), f16)
        tg.copy(a.tile((64, 32), (0, 0)), sa)
        tg.copy(b.tile((64, 32), (0, 0)), sb)
        tg.gemm(acc, sa, sb)  # @pin-acc-gemm
        tg.copy(acc, c.tile((64, 64), (0, 0)))
    text = expect(k, SynthesisError, "@pin-acc-gemm", "accumulator", "register<64x64, f32>",
                  "(128,32):(1,128)", "mma.m16n8k16", also=("@pin-acc",))
    assert TV_LAYOUT.search(text.split(" needs ", 1)[1]), text   # the MMA's layout, too


def test_pinned_operand_that_the_mma_cannot_read():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
        acc = tg.zeros((64, 64), f32)
        ra = tg.load(a.tile((64, 32), (0, 0)), layout=Layout((128, 16), (1, 128)))  # @pin-a
        rb = tg.load(b.tile((64, 32), (0, 0)))
        tg.gemm(acc, ra, rb)  # @pin-a-gemm
        tg.copy(acc, c.tile((64, 64), (0, 0)))
    text = expect(k, SynthesisError, "@pin-a-gemm", "operand a", "register<64x32, f16>",
                  "(128,16):(1,128)", "mma.m16n8k16", also=("@pin-a",))
    assert "internal" not in text
    assert TV_LAYOUT.search(text.split("in the layout", 1)[1]), text  # the MMA's layout


def test_two_pinned_layouts_disagree_across_an_elementwise_op():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        x = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (1, 128)))  # @pin-x
        y = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (32, 1)))  # @pin-y
        x += y  # @pin-add
        tg.copy(x, c.tile((64, 64), (0, 0)))
    expect(k, SynthesisError, "@pin-add", "pinned", "disagree", "elementwise",
           "(128,32):(1,128)", "(128,32):(32,1)", "register<64x64, f32>",
           also=("@pin-x", "@pin-y"))


def test_two_pinned_layouts_disagree_across_a_register_copy():
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        x = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (1, 128)))  # @cp-x
        y = tg.register((64, 64), f32, layout=Layout((128, 32), (32, 1)))  # @cp-y
        tg.copy(x, y)  # @cp-copy
        tg.copy(y, c.tile((64, 64), (0, 0)))
    expect(k, SynthesisError, "@cp-copy", "pinned", "disagree", "(128,32):(1,128)",
           "(128,32):(32,1)", also=("@cp-x", "@cp-y"))


def test_one_pinned_layout_is_converted_not_an_error():
    """Only pinned-against-pinned is unsatisfiable: an unpinned result takes one operand's
    layout and the other operand gets a conversion."""
    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        x = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (1, 128)))
        y = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (32, 1)))
        tg.copy(x + y, c.tile((64, 64), (0, 0)))
    result = build(k)
    assert len(result.synthesis.conversions) == 1


@tg.kernel(threads=128)
def gemm_tile_smaller_than_the_warps(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    acc = tg.zeros((16, 16), f32)
    tg.gemm(acc, tg.load(a.tile((16, 16), (0, 0))), tg.load(b.tile((16, 16), (0, 0))))  # @tiny
    tg.copy(acc, c.tile((16, 16), (0, 0)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_a_gemm_tile_too_small_for_the_warps_suggests_a_block_that_fits(target):
    with pytest.raises(SynthesisError, match="no MMA fits") as err:
        build(gemm_tile_smaller_than_the_warps, {}, None, target)
    assert "too small for 4 warps: it fits a block of threads=64" in str(err.value)
    assert f":{line_of('@tiny')}" in str(err.value)
    # ... and the suggestion is right: the same tile on 64 threads builds.
    build(gemm_tile_smaller_than_the_warps, {"threads": 64}, None, target)
