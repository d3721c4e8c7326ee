"""tegula.layout: the layout algebra (CuTe layouts, swizzles, F2 linear layouts).

This package imports nothing else from tegula.
"""
from __future__ import annotations

from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout
from tegula.layout.cute_bridge import linear_from_cute, linear_from_cute_tv, linear_to_cute
from tegula.layout.cute import Layout
from tegula.layout.algebra import (
    append, blocked_product, can_complement, can_compose, can_divide, can_invert, can_product,
    coalesce, complement, composition, filter_layout, flat_divide, flat_product, left_inverse,
    logical_divide, logical_product, make_layout, make_layout_tv, make_ordered_layout,
    max_common_layout, max_common_vector, prepend, raked_product, right_inverse, select,
    tile_to_shape, tiled_divide, tiled_product, zipped_divide, zipped_product,
)
from tegula.layout.swizzle import ComposedLayout, Swizzle, make_swizzled_layout
from tegula.layout.symbolic import Sym, sym
from tegula.layout.render import (
    render_bank_text, render_text, render_tv_text, svg_layout, svg_mma_atom, svg_shared_layout,
    svg_tv_layout,
)
from tegula.layout.banks import BankReport, bank_conflicts, bank_report
from tegula.layout.optimal_swizzle import SwizzleCost, cute_swizzle_for, optimal_swizzle, swizzle_cost
from tegula.layout.conversion import ConversionPlan, plan_conversion, simulate_conversion
