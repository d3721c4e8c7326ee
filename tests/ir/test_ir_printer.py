"""The tile IR printer: stable text for a small kernel, layouts, choices, line comments."""
from __future__ import annotations

import re

import tegula as tg
from tegula import f16, f32
from tegula.ir.printer import format_kernel, format_tile
from tegula.layout.cute import Layout


@tg.kernel(threads=64)
def scale_rows(x: tg.Tensor[f16], y: tg.Tensor[f16], n: int, BM: tg.constexpr = 32,
               BN: tg.constexpr = 16):
    m = tg.block_id(0)
    buf = tg.shared((BM, BN), f16, stages=2)
    total = tg.zeros((1, BM), f32)
    for j in tg.pipeline(n, stages=2):
        tg.copy(x.tile((BM, BN), (m, j)), buf[j], fill=-1.0)
        v = tg.load(buf[j].T).to(f32)
        total += tg.sum(v * 2.0, axis=0)
        with tg.if_(j >= 1):
            total.assign(total - 1)
    tg.copy(total.to(f16), y.tile((1, BM), (0, m)))


GOLDEN = """\
kernel scale_rows(x: tensor<f16, rank 2>, y: tensor<f16, rank 2>, n: int) threads=64 BM=32 BN=16
  %s0: shared<32x16, f16> x2 stages
  %r0: register<1x32, f32>
  %r1: register<16x32, f16>
  %r2: register<16x32, f32>
  %r3: register<16x32, f32>
  %r4: register<1x32, f32>
  %r5: register<1x32, f32>
  %r6: register<1x32, f16>
  fill %r0, 0.0
  for i0 in pipeline(0, n, 1, stages=2):
    %x.0: global<32x16, f16> = view x origin ((block_id(0) * 32), (i0 * 16)) dims (32@d0, 16@d1)
    copy %x.0 -> %s0[i0] fill=-1.0
    copy %s0[i0].T -> %r1
    %r2 = cast %r1 to f32
    %r3 = mul %r2, 2.0
    %r4 = reduce.sum %r3, axis=0
    %r0 = add %r0, %r4
    if (i0 >= 1):
      %r5 = sub %r0, 1.0
      copy %r5 -> %r0
  %r6 = cast %r0 to f16
  %y.0: global<1x32, f16> = view y origin (0, (block_id(0) * 32)) dims (1@d0, 32@d1)
  copy %r6 -> %y.0
"""


def without_line_comments(text: str) -> str:
    return "\n".join(re.sub(r"\s*# line \d+$", "", line) for line in text.splitlines()) + "\n"


def test_golden_text():
    assert without_line_comments(format_kernel(scale_rows.trace_fresh())) == GOLDEN


def test_every_op_line_names_its_source_line():
    text = format_kernel(scale_rows.trace_fresh())
    with open(__file__) as f:
        source = f.read().splitlines()
    for line in text.splitlines():
        found = re.search(r"# line (\d+)$", line)
        if line.lstrip().startswith(("copy", "fill", "%r", "for", "if")) and " = view " not in line:
            assert found, line
        if found:
            assert 1 <= int(found.group(1)) <= len(source)
    loop_line = next(line for line in text.splitlines() if line.lstrip().startswith("for"))
    lineno = int(loop_line.rsplit(" ", 1)[1])
    assert "tg.pipeline(n, stages=2)" in source[lineno - 1]


def test_layouts_and_choices_are_printed():
    t = scale_rows.trace_fresh()
    t.shared_allocs[0].layout = Layout((32, 16), (16, 1))
    acc = t.register_tiles[0]
    acc.layout, acc.pinned = Layout((64, 1), (1, 0)), True  # any TV layout object
    t.body[1].body[0].choices.update(vec=8, instr="cp.async.cg.16")
    text = format_kernel(t)
    assert "%s0: shared<32x16, f16> x2 stages layout=(32,16):(16,1)" in text
    assert "%r0: register<1x32, f32> layout=(64,1):(1,0) (pinned)" in text
    assert "copy %x.0 -> %s0[i0] fill=-1.0 {instr=cp.async.cg.16, vec=8}" in text
    assert format_tile(acc) == "%r0: register<1x32, f32> layout=(64,1):(1,0) (pinned)"
