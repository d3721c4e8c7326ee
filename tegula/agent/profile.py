"""The profiling summary the agent sees in the optimization stage: `tegula explain`'s
analysis of each distinct kernel a candidate launched (layouts, instructions, bank
conflicts, resources, the cost model's predicted time), trimmed to a budget of text.

On a machine without a GPU the cost model's predicted time (summed over the launches of
one forward call) is also the loop's measure for ranking correct kernels; on a GPU the
measured median is.
"""
from __future__ import annotations

from typing import Any


def explain_launches(launches: list, max_chars: int = 6000) -> tuple[str, float | None]:
    """(report text, predicted seconds of the latest launch of each distinct kernel)."""
    from tegula.build import build
    from tegula.explain import explain_build
    from tegula.synth.cost import estimate
    from tegula.synth.facts import TensorFacts

    latest: dict = {}
    for record in launches:  # one report per (kernel, constexprs): the latest launch's
        key = (id(record.kernel), tuple(sorted(record.constexprs.items())))
        latest[key] = record
    parts, total = [], 0.0
    for record in latest.values():
        facts = {name: TensorFacts.of(shape, _row_major(shape), 0, _elem_bytes(record, name))
                 for name, shape in record.shapes.items()}
        try:
            result = build(record.kernel, record.constexprs, facts)
            parts.append(explain_build(result, grid=record.grid, shapes=record.shapes))
            seconds = estimate(result, record.grid, record.shapes).seconds
            total += seconds or 0.0
        except Exception as err:  # explain is advice; a failure to explain is reported
            parts.append(f"(could not explain {getattr(record.kernel, 'name', '?')}: {err})")
    text = "\n".join(parts)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n... ({len(text) - max_chars} more characters cut)"
    return text, (total if latest else None)


def _row_major(shape: tuple) -> tuple:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _elem_bytes(record: Any, name: str) -> float:
    for param in getattr(record.kernel, "params", []):
        if param.name == name:
            return param.spec.dtype.bits / 8
    return 4


__all__ = ["explain_launches"]
