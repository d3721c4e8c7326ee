"""The one exception type of the layout algebra.

Every inadmissible operation raises `LayoutError` with a sentence saying why, and the
operands printed in CuTe notation, so a user can reproduce the failure by hand.
"""
from __future__ import annotations


class LayoutError(ValueError):
    """An operation of the layout algebra was asked for on operands that do not admit it."""
