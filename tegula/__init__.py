"""tegula: a tile-level GPU kernel language whose compiler synthesizes every layout."""
from __future__ import annotations

__version__ = "0.1.0"
