"""tegula.layout: the layout algebra (CuTe layouts, swizzles, F2 linear layouts).

This package imports nothing else from tegula.
"""
from __future__ import annotations

from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout
