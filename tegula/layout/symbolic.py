"""Symbolic extents: integer polynomials over named symbols with divisibility facts.

A global tensor's extents are often unknown when a kernel is compiled, but *facts* about
them are known: `K % 8 == 0` (so rows of f16 start 16-byte aligned), `M >= 1`. A `Sym`
is an integer polynomial over such symbols (`8*K`, `M*K`, `K//8` when `K % 8 == 0`) that
can stand wherever a layout leaf (a shape or a stride) is an integer.

The idea of the representation: a symbol declared `multiple_of=d` is stored as `d*u`
where the *unit* `u` is an arbitrary integer `>= 1` (or `>= ceil(at_least/d)`). In unit
space every polynomial the algebra can produce has integer coefficients, so

* exact division (`K // 8`) is coefficient division,
* the known divisor of a value is the gcd of its unit-space coefficients,
* a lower bound follows from every unit's lower bound when all coefficients agree in sign.

Arithmetic stays symbolic where the result is exact. Questions (`==`, `<`, `bool`, `%`,
non-exact `//`) are answered with a plain Python value when the facts decide them and
otherwise raise `LayoutError` saying what would have to be known. The answers are sound:
a decided answer holds for every admissible assignment of the symbols.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Union

from tegula.layout.errors import LayoutError

# A monomial is a sorted tuple of (symbol name, exponent); () is the constant monomial.
Monomial = tuple[tuple[str, int], ...]
IntLike = Union[int, "Sym"]


@dataclass(frozen=True)
class SymbolFacts:
    """What is known about one symbol: it is a positive multiple of `multiple_of`, `>= at_least`."""

    name: str
    multiple_of: int = 1
    at_least: int = 1

    @property
    def unit_lower_bound(self) -> int:
        """The smallest value of the unit `u` in `symbol = multiple_of * u`."""
        return max(1, -(-self.at_least // self.multiple_of))

    def describe(self) -> str:
        """The facts as a reader would write them; the bound only where it says more."""
        parts = []
        if self.multiple_of > 1:
            parts.append(f"{self.name} % {self.multiple_of} == 0")
        lower = self.multiple_of * self.unit_lower_bound
        if lower > self.multiple_of or not parts:
            parts.append(f"{self.name} >= {lower}")
        return ", ".join(parts)


# Declaration order of symbol names, so `M*K` prints in the order the user introduced them.
_DECLARED: dict[str, int] = {}


def sym(name: str, multiple_of: int = 1, at_least: int = 1) -> Sym:
    """A positive integer symbol known to be a multiple of `multiple_of` and `>= at_least`."""
    if not name.isidentifier():
        raise LayoutError(f"symbol name {name!r} is not an identifier")
    if not isinstance(multiple_of, int) or multiple_of < 1:
        raise LayoutError(f"multiple_of must be a positive int, got {multiple_of!r}")
    if not isinstance(at_least, int) or at_least < 1:
        raise LayoutError(f"symbols are positive: at_least must be >= 1, got {at_least!r}")
    facts = SymbolFacts(name, multiple_of, at_least)
    _DECLARED.setdefault(name, len(_DECLARED))
    return Sym({((name, 1),): multiple_of}, {name: facts})


def _merge_facts(a: Mapping[str, SymbolFacts],
                 b: Mapping[str, SymbolFacts]) -> dict[str, SymbolFacts]:
    """Union of two fact tables; the same name with different facts is a user error."""
    out = dict(a)
    for name, facts in b.items():
        known = out.get(name)
        if known is None:
            out[name] = facts
        elif known != facts:
            raise LayoutError(f"symbol {name} is declared twice with different facts: "
                              f"{known.describe()} and {facts.describe()}")
    return out


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps: dict[str, int] = dict(a)
    for name, e in b:
        exps[name] = exps.get(name, 0) + e
    return tuple(sorted(exps.items()))


def _mono_div(a: Monomial, b: Monomial) -> Monomial | None:
    """a / b as a monomial, or None when b does not divide a."""
    exps: dict[str, int] = dict(a)
    for name, e in b:
        have = exps.get(name, 0)
        if have < e:
            return None
        if have == e:
            del exps[name]
        else:
            exps[name] = have - e
    return tuple(sorted(exps.items()))


class Sym:
    """A non-constant integer polynomial over named positive symbols (see the module doc).

    Instances are immutable. Operations whose result is constant return a plain `int`,
    so a `Sym` always really depends on a symbol.
    """

    __slots__ = ("_terms", "_facts", "_hash")

    def __init__(self, terms: Mapping[Monomial, int], facts: Mapping[str, SymbolFacts]):
        # Terms are in unit space (see the module doc); zero coefficients are dropped.
        self._terms: dict[Monomial, int] = {m: c for m, c in terms.items() if c != 0}
        used = {name for m in self._terms for name, _ in m}
        self._facts: dict[str, SymbolFacts] = {n: f for n, f in facts.items() if n in used}
        self._hash: int | None = None

    # ---- construction helpers -------------------------------------------------------------

    @staticmethod
    def _make(terms: Mapping[Monomial, int], facts: Mapping[str, SymbolFacts]) -> IntLike:
        """A Sym, or an int when no symbol survives."""
        live = {m: c for m, c in terms.items() if c != 0}
        if all(m == () for m in live):
            return live.get((), 0)
        return Sym(live, facts)

    @staticmethod
    def _lift(x: Any) -> Sym | None:
        """View an int as a (constant) polynomial so binary operations have one code path."""
        if isinstance(x, Sym):
            return x
        if isinstance(x, int) and not isinstance(x, bool):
            obj = object.__new__(Sym)
            obj._terms = {(): x} if x else {}
            obj._facts = {}
            obj._hash = None
            return obj
        return None

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(self._facts)

    @property
    def facts(self) -> Mapping[str, SymbolFacts]:
        return dict(self._facts)

    def _const(self) -> int:
        return self._terms.get((), 0)

    def _nonconst(self) -> dict[Monomial, int]:
        return {m: c for m, c in self._terms.items() if m != ()}

    def _describe_facts(self) -> str:
        return ", ".join(self._facts[n].describe() for n in sorted(self._facts))

    def _undecidable(self, question: str) -> LayoutError:
        return LayoutError(f"cannot decide {question}: only {self._describe_facts()} "
                           f"{'is' if len(self._facts) == 1 else 'are'} known")

    # ---- arithmetic -----------------------------------------------------------------------

    def __add__(self, other: Any) -> IntLike:
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        terms = dict(self._terms)
        for m, c in o._terms.items():
            terms[m] = terms.get(m, 0) + c
        return Sym._make(terms, _merge_facts(self._facts, o._facts))

    __radd__ = __add__

    def __neg__(self) -> IntLike:
        return Sym._make({m: -c for m, c in self._terms.items()}, self._facts)

    def __pos__(self) -> Sym:
        return self

    def __sub__(self, other: Any) -> IntLike:
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        return self + (-o)

    def __rsub__(self, other: Any) -> IntLike:
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        return o + (-self)

    def __mul__(self, other: Any) -> IntLike:
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        terms: dict[Monomial, int] = {}
        for ma, ca in self._terms.items():
            for mb, cb in o._terms.items():
                m = _mono_mul(ma, mb)
                terms[m] = terms.get(m, 0) + ca * cb
        return Sym._make(terms, _merge_facts(self._facts, o._facts))

    __rmul__ = __mul__

    def __pow__(self, exponent: int) -> IntLike:
        if not isinstance(exponent, int) or exponent < 0:
            return NotImplemented
        result: IntLike = 1
        for _ in range(exponent):
            result = result * self
        return result

    def _exact_quotient(self, o: Sym) -> IntLike | None:
        """self / o when o is a single term that divides every term of self exactly."""
        if len(o._terms) != 1:
            return None
        (mo, co), = o._terms.items()
        terms: dict[Monomial, int] = {}
        for m, c in self._terms.items():
            q = _mono_div(m, mo)
            if q is None or c % co != 0:
                return None
            terms[q] = c // co
        return Sym._make(terms, _merge_facts(self._facts, o._facts))

    def __floordiv__(self, other: Any) -> IntLike:
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        if not o._terms:
            raise ZeroDivisionError(f"{self} // 0")
        if isinstance(other, int):
            return self._floordiv_int(other)
        q = self._exact_quotient(o)
        if q is not None:
            return q
        if _decide_nonneg(self) and _decide_pos(o - self):
            return 0  # 0 <= self < other
        raise _merged(self, o)._undecidable(f"{self} // {o} exactly")

    def _floordiv_int(self, n: int) -> IntLike:
        # (s + c) // n == s/n + c // n whenever n divides the symbolic part s exactly.
        rest = self._nonconst()
        if all(c % n == 0 for c in rest.values()):
            terms = {m: c // n for m, c in rest.items()}
            terms[()] = self._const() // n
            return Sym._make(terms, self._facts)
        raise self._undecidable(f"{_paren(self)} // {n} exactly (whether "
                                f"{_sym_part_str(self)} is divisible by {n})")

    def __rfloordiv__(self, other: Any) -> IntLike:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        return _rdiv_const(other, self)

    def __mod__(self, other: Any) -> IntLike:
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        if not o._terms:
            raise ZeroDivisionError(f"{self} % 0")
        if isinstance(other, int):
            rest = self._nonconst()
            if all(c % other == 0 for c in rest.values()):
                return self._const() % other
            raise self._undecidable(f"whether {_sym_part_str(self)} is divisible by {other}")
        if self._exact_quotient(o) is not None:
            return 0
        if _decide_nonneg(self) and _decide_pos(o - self):
            return self
        raise _merged(self, o)._undecidable(f"{self} % {o}")

    def __rmod__(self, other: Any) -> IntLike:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        if other == 0 and _provably_nonzero(self):
            return 0
        if other > 0 and _decide_pos(self - other):
            return other  # 0 < other < self
        raise self._undecidable(f"{other} % {self}")

    def __truediv__(self, other: Any) -> Any:
        raise LayoutError(f"use // for exact division of symbolic extents ({self} / {other})")

    __rtruediv__ = __truediv__

    def __abs__(self) -> IntLike:
        if _decide_nonneg(self):
            return self
        if _decide_nonneg(-self):
            return -self
        raise self._undecidable(f"the sign of {self}")

    # ---- questions ------------------------------------------------------------------------

    def __eq__(self, other: Any) -> bool:  # type: ignore[override]
        o = Sym._lift(other)
        if o is None:
            return NotImplemented
        return _decide_zero(self - o, f"whether {self} == {other}")

    def __ne__(self, other: Any) -> bool:  # type: ignore[override]
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __lt__(self, other: Any) -> bool:
        return _compare(other, self, strict=True, text=f"whether {self} < {other}")

    def __le__(self, other: Any) -> bool:
        return _compare(other, self, strict=False, text=f"whether {self} <= {other}")

    def __gt__(self, other: Any) -> bool:
        return _compare(self, other, strict=True, text=f"whether {self} > {other}")

    def __ge__(self, other: Any) -> bool:
        return _compare(self, other, strict=False, text=f"whether {self} >= {other}")

    def __bool__(self) -> bool:
        return not _decide_zero(self, f"whether {self} is nonzero")

    def __int__(self) -> int:
        raise LayoutError(f"{self} is symbolic: it has no static integer value "
                          f"(known: {self._describe_facts()})")

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((frozenset(self._terms.items()),
                               frozenset(self._facts.values())))
        return self._hash

    # ---- printing -------------------------------------------------------------------------

    def __str__(self) -> str:
        return _format(self)

    def __repr__(self) -> str:
        return f"Sym({self}; {self._describe_facts()})"


# ---- deciding ---------------------------------------------------------------------------------


def _merged(a: Sym, b: Sym) -> Sym:
    """A carrier of both operands' facts, used only for error messages."""
    return _carrier(a, b)


def _mono_lower(facts: Mapping[str, SymbolFacts], m: Monomial) -> int:
    """Smallest value of a unit-space monomial (every unit is >= its lower bound >= 1)."""
    return math.prod(facts[name].unit_lower_bound ** e for name, e in m)


def _bounds(p: Sym) -> tuple[int | None, int | None]:
    """(lower, upper) bounds of p over all admissible assignments, None where unbounded/unknown.

    With every unit >= 1, p is monotone in each unit when all non-constant coefficients
    share a sign; then its extreme value is at the units' lower bounds.
    """
    rest = p._nonconst()
    at_min = p._const() + sum(c * _mono_lower(p._facts, m) for m, c in rest.items())
    if not rest:
        return at_min, at_min
    if all(c > 0 for c in rest.values()):
        return at_min, None
    if all(c < 0 for c in rest.values()):
        return None, at_min
    return None, None


def _decide_pos(p: IntLike) -> bool:
    """True when p > 0 is provable; False otherwise (never raises)."""
    if isinstance(p, int):
        return p > 0
    lo, _ = _bounds(p)
    return lo is not None and lo > 0


def _decide_nonneg(p: IntLike) -> bool:
    """True when p >= 0 is provable; False otherwise (never raises)."""
    if isinstance(p, int):
        return p >= 0
    lo, _ = _bounds(p)
    return lo is not None and lo >= 0


def _decide_zero(p: IntLike, text: str) -> bool:
    """Whether p == 0, or raise when the facts do not decide it."""
    if not isinstance(p, Sym):
        return p == 0
    rest = p._nonconst()
    if not rest:
        return p._const() == 0
    lo, hi = _bounds(p)
    if (lo is not None and lo > 0) or (hi is not None and hi < 0):
        return False
    # Every admissible value of the symbolic part is a multiple of g; a constant that is
    # not a multiple of g can never cancel it.
    g = math.gcd(*rest.values())
    if p._const() % g != 0:
        return False
    raise p._undecidable(text)


def _compare(big: Any, small: Any, strict: bool, text: str) -> bool:
    """Decide big > small (strict) or big >= small, or raise."""
    a, b = Sym._lift(big), Sym._lift(small)
    if a is None or b is None:
        return NotImplemented  # type: ignore[return-value]
    d = Sym._lift(a - b)
    assert d is not None  # a - b of two polynomials is an int or a Sym
    lo, hi = _bounds(d)
    if lo is not None and (lo > 0 or (lo >= 0 and not strict)):
        return True
    if hi is not None and (hi <= 0 if strict else hi < 0):
        return False
    raise _merged(a, b)._undecidable(text)


def _provably_nonzero(p: IntLike) -> bool:
    """True when p != 0 holds for every admissible assignment (never raises)."""
    try:
        return not _decide_zero(p, "")
    except LayoutError:
        return False


def _rdiv_const(n: int, s: Sym) -> int:
    """n // s for an integer n: decidable when 0 <= n < s (result 0)."""
    if (n == 0 and _provably_nonzero(s)) or (n > 0 and _decide_pos(s - n)):
        return 0
    raise s._undecidable(f"{n} // {s}")


def _paren(x: IntLike) -> str:
    """x for use as an operand in a message: a sum gets parentheses."""
    text = str(x)
    return f"({text})" if isinstance(x, Sym) and len(x._terms) > 1 else text


def _sym_part_str(p: Sym) -> str:
    rest = p._nonconst()
    return _format(Sym(rest, p._facts)) if rest else "0"


# ---- printing ---------------------------------------------------------------------------------


def _symbol_space(p: Sym, m: Monomial, c: int) -> Fraction:
    """The coefficient of monomial m in terms of the symbols (not their units)."""
    return Fraction(c, math.prod(p._facts[n].multiple_of ** e for n, e in m))


def _format_term(m: Monomial, coef: Fraction, first: bool) -> str:
    sign = "-" if coef < 0 else ("" if first else "+")
    coef = abs(coef)
    ordered = sorted(m, key=lambda ne: (_DECLARED.get(ne[0], len(_DECLARED)), ne[0]))
    names = "*".join(n if e == 1 else f"{n}**{e}" for n, e in ordered)
    if not names:
        body = str(coef)
    else:
        num = "" if coef.numerator == 1 else f"{coef.numerator}*"
        body = num + names + ("" if coef.denominator == 1 else f"//{coef.denominator}")
    if first:
        return sign + body
    return f" {sign} {body}"


def _format(p: Sym) -> str:
    """Terms by descending degree then name, constant last: `M*K + 8*K - 16`."""
    def order(item: tuple[Monomial, int]) -> tuple[int, int, Monomial]:
        m, _ = item
        return (m == (), -sum(e for _, e in m), m)

    terms = sorted(p._terms.items(), key=order)
    if not terms:
        return "0"
    return "".join(_format_term(m, _symbol_space(p, m, c), i == 0)
                   for i, (m, c) in enumerate(terms))


# ---- public helpers -------------------------------------------------------------------------


def is_symbolic(x: Any) -> bool:
    """Whether x (a leaf or a nested tuple) mentions a symbol."""
    if isinstance(x, tuple):
        return any(is_symbolic(e) for e in x)
    return isinstance(x, Sym)


def is_static(x: Any) -> bool:
    """Whether x (a leaf or a nested tuple) is made of plain integers only."""
    return not is_symbolic(x)


def divisibility(x: IntLike) -> int:
    """The largest integer known to divide x for every admissible value of its symbols.

    For a static int this is |x| (0 for 0, which every integer divides).
    """
    if isinstance(x, Sym):
        return math.gcd(*x._terms.values())
    return abs(x)


def symbols_of(x: Any) -> frozenset[str]:
    """The names of all symbols in x (a leaf or a nested tuple)."""
    if isinstance(x, tuple):
        return frozenset().union(*(symbols_of(e) for e in x)) if x else frozenset()
    return x.symbols if isinstance(x, Sym) else frozenset()


def substitute(x: Any, values: Mapping[str, int]) -> Any:
    """Evaluate x (a leaf or nested tuple) at concrete symbol values, checking the facts."""
    if isinstance(x, tuple):
        return tuple(substitute(e, values) for e in x)
    if not isinstance(x, Sym):
        return x
    units: dict[str, int] = {}
    for name, facts in x._facts.items():
        if name not in values:
            raise LayoutError(f"no value given for symbol {name}")
        v = values[name]
        if v % facts.multiple_of != 0 or v < facts.multiple_of * facts.unit_lower_bound:
            raise LayoutError(f"{name} = {v} violates the declared facts {facts.describe()}")
        units[name] = v // facts.multiple_of
    return sum(c * math.prod(units[n] ** e for n, e in m) for m, c in x._terms.items())


def known_equal(a: Any, b: Any) -> bool:
    """True when a == b is provable; False when it is false *or undecidable* (never raises).

    For algebra simplifications that are optional (coalescing two modes, dropping a size-1
    mode): not simplifying is always correct, so "unknown" means "do not simplify".
    """
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(known_equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, Sym) or isinstance(b, Sym):
        d = Sym._lift(a - b)
        return d is not None and not d._terms
    return a == b


def divides(d: IntLike, x: IntLike) -> bool | None:
    """Three-valued `x % d == 0`: True/False when decided, None when the facts cannot tell."""
    try:
        return (x % d) == 0
    except LayoutError:
        pass
    if isinstance(x, Sym) and isinstance(d, int):
        # x = s + c with every value of s a multiple of g = gcd(divisibility(s), d): if g
        # does not divide c, neither does d divide x (e.g. 16 never divides K + 3, K % 8 == 0).
        g = math.gcd(divisibility(Sym(x._nonconst(), x._facts)), d)
        if x._const() % g != 0:
            return False
    return None


def sym_gcd(a: IntLike, b: IntLike) -> IntLike:
    """gcd(a, b) where it is determined by the facts; raises LayoutError otherwise.

    Determined means: both static, or one operand provably divides the other.
    """
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return math.gcd(a, b)
    for x, y in ((a, b), (b, a)):
        if known_equal(x, 0):
            return abs(y)
        if divides(x, y) is True:
            return abs(x)
    raise _carrier(a, b)._undecidable(f"gcd({a}, {b})")


def sym_ceil_div(a: IntLike, b: IntLike) -> IntLike:
    """ceil(a / b) for positive b where the facts determine it as a polynomial.

    Exact when b divides a; 1 when 0 < a <= b. A ceiling of a non-multiple has no
    polynomial form (it is the partial last tile of a predicated loop), so it is refused.
    """
    if divides(b, a) is True:
        return a // b
    if _decide_pos(a) and _decide_nonneg(b - a):
        return 1
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return -(-a // b)
    raise _carrier(a, b)._undecidable(f"ceil_div({a}, {b}) exactly (whether {b} divides {a})")


def sym_shape_div(a: IntLike, b: IntLike) -> IntLike:
    """CuTe's shape_div on leaves: a / b when b divides a, 1 when a divides b.

    Each test is asked so that an undecidable one does not hide a decided one:
    shape_div(1, M) is 1 although `1 % M` is unknown.
    """
    if divides(b, a) is True:
        return a // b
    if divides(a, b) is True:
        return 1
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        raise LayoutError(f"shape_div({a}, {b}): neither divides the other")
    raise _carrier(a, b)._undecidable(f"whether {b} divides {a} or {a} divides {b}")


def sym_min(*xs: IntLike) -> IntLike:
    """min that succeeds when one argument is provably <= all others (ties allowed)."""
    return _extreme(xs, want_min=True)


def sym_max(*xs: IntLike) -> IntLike:
    """max that succeeds when one argument is provably >= all others (ties allowed)."""
    return _extreme(xs, want_min=False)


def _extreme(vals: tuple[IntLike, ...], want_min: bool) -> IntLike:
    if not vals:
        raise LayoutError("min/max of no values")
    for i, cand in enumerate(vals):
        # Python's min would ask `x < cand`, which may be undecidable even when cand is the
        # answer (ties such as min(M, 16) with M >= 16); ask `x - cand >= 0` instead.
        if all(_decide_nonneg(v - cand if want_min else cand - v)
               for j, v in enumerate(vals) if j != i):
            return cand
    name = "min" if want_min else "max"
    carrier = _carrier(*vals)
    raise carrier._undecidable(f"{name}({', '.join(map(str, vals))})")


def _carrier(*xs: IntLike) -> Sym:
    """A Sym holding the facts of all symbolic xs, for error messages."""
    out = object.__new__(Sym)
    out._terms, out._hash, out._facts = {}, None, {}
    for x in xs:
        if isinstance(x, Sym):
            out._facts = _merge_facts(out._facts, x._facts)
    return out


__all__ = ["Sym", "SymbolFacts", "sym", "is_symbolic", "is_static", "divisibility",
           "symbols_of", "substitute", "known_equal", "divides", "sym_gcd", "sym_ceil_div",
           "sym_shape_div", "sym_min",
           "sym_max"]
