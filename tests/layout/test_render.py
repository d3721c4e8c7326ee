"""Text and SVG pictures of layouts (tegula.layout.render)."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError
from tegula.layout.render import (
    bank_color, default_tile_shape, render_bank_text, render_text, render_tv_text, svg_layout, svg_mma_atom,
    svg_shared_layout, svg_tv_layout, thread_color, tv_cells,
)

SVG_NS = "{http://www.w3.org/2000/svg}"

# mma.sync.m16n8k16 f16 fragments as CuTe TV layouts; checked below against the PTX ISA.
MMA_A = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))   # (M,K) = (16,16)
MMA_B = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))           # (N,K) = (8,16)
MMA_C = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))           # (M,N) = (16,8)


def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """(row m, col k) of a_i, PTX ISA fragment table for mma.m16n8k16 .f16 A."""
    g, tig = lane // 4, lane % 4
    return g + 8 * ((i >> 1) & 1), 2 * tig + (i & 1) + 8 * (i >> 2)


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    """(row k, col n) of b_i, PTX ISA fragment table for mma.m16n8k16 .f16 B."""
    g, tig = lane // 4, lane % 4
    return 2 * tig + (i & 1) + 8 * (i >> 1), g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row m, col n) of c_i: rows lane//4 and lane//4+8, cols 2*(lane%4)+{0,1}."""
    return lane // 4 + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)


def grid_rows(text: str) -> list[list[str]]:
    """The cells of a rendered grid (skipping the layout line, header and rule)."""
    body = text.splitlines()[3:]
    return [line.split("|", 1)[1].split() for line in body]


def parse_svg(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG_NS}text")]


def tooltips(root: ET.Element) -> str:
    return " ".join(t.text or "" for t in root.iter(f"{SVG_NS}title"))


# --------------------------------------------------------------------------- text

def test_render_text_rank2_nested_matches_cute_print_layout():
    layout = Layout(((2, 4), (2, 2)), ((8, 1), (4, 16)))
    out = render_text(layout)
    assert out.splitlines()[0] == "((2,4),(2,2)):((8,1),(4,16))"
    rows = grid_rows(out)
    assert len(rows) == 8
    assert rows[0] == ["0", "4", "16", "20"]
    assert rows[1] == ["8", "12", "24", "28"]
    assert rows[7] == ["11", "15", "27", "31"]


def test_render_text_columns_are_aligned():
    lines = render_text(Layout((3, 4), (1, 100))).splitlines()[1:]
    assert len({len(line) for line in lines if "|" in line}) == 1


def test_render_text_rank1_is_one_row():
    rows = grid_rows(render_text(Layout(8, 2)))
    assert rows == [[str(2 * i) for i in range(8)]]


def test_render_text_rank3_groups_columns_by_mode():
    out = render_text(Layout((4, 2, 3), (1, 4, 8)))
    first = out.splitlines()[3]
    assert first.split("|", 1)[1].split() == ["0", "4", "|", "8", "12", "|", "16", "20"]


def test_render_text_tile_shape_reinterprets_domain():
    rows = grid_rows(render_text(Layout(8, 1), (2, 4)))
    assert rows == [["0", "2", "4", "6"], ["1", "3", "5", "7"]]
    with pytest.raises(LayoutError):
        render_text(Layout(8, 1), (3, 3))


def test_render_bank_text_shows_xor_swizzle():
    from tegula.layout.swizzle import ComposedLayout, Swizzle

    plain = Layout((8, 8), (8, 1))   # 8x8 words: every row starts in bank 0 (mod 8)
    rows = grid_rows(render_bank_text(plain, (8, 8), elem_bytes=4, banks=8))
    assert [r[0] for r in rows] == ["0"] * 8
    swizzled = ComposedLayout(Swizzle(3, 0, 3), 0, plain)
    rows = grid_rows(render_bank_text(swizzled, (8, 8), elem_bytes=4, banks=8))
    assert [r[0] for r in rows] == [str(i) for i in range(8)]   # column 0 in 8 banks


# --------------------------------------------------------------------------- TV layouts

def test_mma_fragments_match_ptx_isa():
    for lane in range(32):
        for i in range(8):
            m, k = ptx_a(lane, i)
            assert MMA_A(lane + 32 * i) == m + 16 * k
        for i in range(4):
            k, n = ptx_b(lane, i)
            assert MMA_B(lane + 32 * i) == n + 8 * k
            m, n = ptx_c(lane, i)
            assert MMA_C(lane + 32 * i) == m + 16 * n


def test_tv_text_labels_every_cell_of_the_c_fragment():
    rows = grid_rows(render_tv_text(MMA_C, (16, 8)))
    assert len(rows) == 16 and all(len(r) == 8 for r in rows)
    for lane in range(32):
        for i in range(4):
            m, n = ptx_c(lane, i)
            assert rows[m][n] == f"T{lane}V{i}"


def test_tv_text_shows_every_replica_of_a_broadcast_cell():
    tv = Layout((8, 2), (1, 0))   # value mode stride 0: each thread holds its cell twice
    rows = grid_rows(render_tv_text(tv, (8, 1)))
    assert rows[3] == ["T3V0|T3V1"]
    tv = Layout(((4, 2), 2), ((1, 0), 4))  # threads t and t+4 share cells
    (_, _), cells = tv_cells(tv, (4, 2))
    assert cells[(1, 1)] == [(1, 1), (5, 1)]
    assert sum(len(p) for p in cells.values()) == 16


def test_tv_text_marks_uncovered_cells_and_rejects_out_of_tile():
    rows = grid_rows(render_tv_text(Layout(2, 2), (4, 1)))
    assert [r[0] for r in rows] == ["T0V0", ".", "T1V0", "."]
    with pytest.raises(LayoutError, match="outside"):
        render_tv_text(Layout(4, 2), (4, 1))


def test_default_tile_shape_is_square_ish_power_of_two():
    assert default_tile_shape(128) == (8, 16)
    assert default_tile_shape(256) == (16, 16)
    assert default_tile_shape(12) == (2, 6)
    assert default_tile_shape(7) == (1, 7)
    (rows, cols), _ = tv_cells(MMA_C)
    assert (rows, cols) == (8, 16)


# --------------------------------------------------------------------------- colours

def test_palettes_are_distinct_within_a_warp_and_across_banks():
    assert len({thread_color(t) for t in range(32)}) == 32
    assert len({bank_color(b) for b in range(32)}) == 32
    assert all(re.fullmatch(r"#[0-9a-f]{6}", thread_color(t)) for t in range(64))


# --------------------------------------------------------------------------- SVG

def test_svg_layout_is_valid_xml_with_every_offset():
    root = parse_svg(svg_layout(Layout(((2, 4), (2, 2)), ((8, 1), (4, 16)))))
    assert "((2,4),(2,2)):((8,1),(4,16))" in texts(root)
    numbers = {int(t) for t in texts(root) if t.isdigit()}
    assert set(range(32)) <= numbers


def test_svg_tv_layout_shows_every_tv_pair():
    tv = Layout(((4, 2), 2), ((1, 0), 4))
    root = parse_svg(svg_tv_layout(tv, (4, 2)))
    tips = tooltips(root)
    for t in range(8):
        for v in range(2):
            assert re.search(rf"\bT{t}V{v}\b", tips)
    assert "T1V1" in texts(root) and "T5V1" in texts(root)
    assert any("thread colours" in t for t in texts(root))


def test_svg_tv_layout_colours_cells_by_thread():
    root = parse_svg(svg_tv_layout(MMA_C, (16, 8)))
    fills = {r.get("fill") for r in root.iter(f"{SVG_NS}rect")}
    assert {thread_color(t) for t in range(32)} <= fills


def test_svg_tv_layout_heavy_broadcast_stays_complete():
    tv = Layout((32, 1), (0, 0))   # all 32 threads hold the same element
    root = parse_svg(svg_tv_layout(tv, (1, 1)))
    tips = tooltips(root)
    assert all(f"T{t}V0" in tips for t in range(32))
    assert "+30 more" in texts(root)


def test_svg_shared_layout_labels_offsets_and_banks():
    layout = Layout((8, 16), (16, 1))   # row-major 8x16 f16
    root = parse_svg(svg_shared_layout(layout, (8, 16), elem_bytes=2))
    tips = tooltips(root)
    assert "(1,3) -> offset 19, bank 9" in tips
    assert "(7,15) -> offset 127, bank 31" in tips
    assert "b31" in texts(root)


def test_svg_mma_atom_draws_all_three_fragments():
    root = parse_svg(svg_mma_atom(MMA_A, MMA_B, MMA_C, (16, 8, 16), title="m16n8k16"))
    all_text = texts(root)
    assert "m16n8k16" in all_text
    assert {"A: k", "B: n", "C: n"} <= set(all_text)
    # 8 A values + 4 B values + 4 C values per lane
    for lane in (0, 13, 31):
        assert sum(1 for t in all_text if re.fullmatch(rf"T{lane}V\d", t)) == 16
    tips = tooltips(root)
    m, k = ptx_a(13, 6)
    assert re.search(rf"\({m},{k}\): T13V6\b", tips)
