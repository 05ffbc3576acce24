"""Exact values of numeric answers, huge ones included, without ever computing what would not fit.

Parses the arithmetic of an answer (integers, decimals, ``\\frac``, ``\\binom``, powers, roots with exact
results, factorials, ``\\times``, ``\\cdot``, ``\\div``, absolute values, any nesting) into an exact value:
a :class:`~fractions.Fraction` while it has at most :data:`MAX_BITS` bits, else a sum of terms, each a
product of prime powers with exact exponents (``2^{10^{100}}`` is ``{2: 10^100}``; ``9^{9^9}`` and
``3^{2 \\cdot 9^9}`` are the same term), and beyond that opaque atoms keyed by their structure
(``2^{10^{10^{10}}}``, ``(10^{10})!``). Equal values then have equal forms, so equality is exact; a
difference that leaves one term, or a term far larger than the rest, is decidedly nonzero. Anything else
(symbols, irrational roots, unknown commands) is not a number here: :func:`value` returns None.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX_BITS = 1 << 20
"""Largest numerator or denominator computed exactly (about 315,000 digits)."""
MAX_LITERAL_DIGITS = 200_000
MAX_FACTORIAL = 50_000
"""Larger factorials stay opaque (their logarithm is known from lgamma)."""
MAX_DEPTH = 100
"""Deepest nesting parsed (after redundant parentheses are dropped)."""
_TRIAL_PRIMES_UP_TO = 10_000


class NotNumeric(Exception):
    """The text is not an arithmetic expression of numbers that this module evaluates."""


Key = tuple  # a term's key: ((base, exponent), ...) sorted; bases are primes or opaque atoms


class Huge:
    """A sum of terms ``coefficient * key`` (see the module docstring), immutable and hashable."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict[Key, Fraction]) -> None:
        self.terms = {k: c for k, c in terms.items() if c}

    def key(self) -> tuple:
        return tuple(sorted(self.terms.items(), key=_order))

    def __repr__(self) -> str:
        return f"Huge({len(self.terms)} terms)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Huge) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


Value = Fraction | Huge


# ----- tokens and redundant parentheses ------------------------------------------------------------

_TOKEN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+|\\[a-zA-Z]+|[-+*/^!(){}\[\]|])")
_ALLOWED_COMMANDS = {"\\frac", "\\binom", "\\sqrt", "\\times", "\\cdot", "\\div"}


def _tokens(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            if text[pos:].strip() == "":
                break
            raise NotNumeric(text[pos : pos + 20])
        token = match.group(1)
        if token.startswith("\\") and token not in _ALLOWED_COMMANDS:
            raise NotNumeric(token)
        tokens.append(token)
        pos = match.end()
    return tokens


_OPEN = {"(": ")", "{": "}", "[": "]"}


def drop_redundant_groups(tokens: list[str]) -> list[str]:
    """``((x))`` to ``(x)`` and ``{(x)}`` to ``{x}`` in one linear pass, so deep nesting costs no depth
    (tokens, or the characters of a LaTeX string); raises NotNumeric when brackets are unbalanced."""
    match: dict[int, int] = {}
    stack: list[int] = []
    for i, t in enumerate(tokens):
        if t in _OPEN:
            stack.append(i)
        elif t in (")", "}", "]"):
            if not stack or _OPEN[tokens[stack[-1]]] != t:
                raise NotNumeric("unbalanced brackets")
            match[stack.pop()] = i
    if stack:
        raise NotNumeric("unbalanced brackets")
    drop: set[int] = set()
    for open_i, close_i in match.items():
        inner = open_i + 1
        while inner in drop:  # already-dropped inner groups do not count
            inner += 1
        if (
            tokens[open_i] in "({"
            and tokens[inner] in "({"
            and match.get(inner) is not None
            and all(j in drop for j in range(match[inner] + 1, close_i))
        ):
            drop.update((inner, match[inner]))
    # keep the outer bracket, drop the inner pair (its kind may be { for a \frac argument: keep outer kind)
    return [t for i, t in enumerate(tokens) if i not in drop]


# ----- the parser ----------------------------------------------------------------------------------


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise NotNumeric(f"expected {expected!r}, got {token!r}")
        self.pos += 1
        return token

    def parse(self) -> Value:
        value = self.expr()
        if self.peek() is not None:
            raise NotNumeric(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Value:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NotNumeric("nested too deeply")
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            value = add(value, right if op == "+" else neg(right))
        self.depth -= 1
        return value

    def term(self) -> Value:
        value = self.unary()
        while True:
            token = self.peek()
            if token in ("*", "\\times", "\\cdot"):
                self.take()
                value = mul(value, self.unary())
            elif token in ("/", "\\div"):
                self.take()
                value = div(value, self.unary())
            elif token in ("(", "\\sqrt", "\\binom") or (token == "\\frac" and not self._after_integer()):
                value = mul(
                    value, self.power()
                )  # implicit product: 2\sqrt{4}, 3(5); 1\frac12 is a mixed number
            else:
                return value

    def _after_integer(self) -> bool:
        previous = self.tokens[self.pos - 1] if self.pos else ""
        return previous.isdigit()

    def unary(self) -> Value:
        if self.peek() in ("-", "+"):
            sign = self.take()
            value = self.unary()
            return neg(value) if sign == "-" else value
        return self.power()

    def power(self) -> Value:
        base = self.postfix()
        if self.peek() == "^":
            self.take()
            exponent = self.unary()  # right-associative: 2^3^2 = 2^(3^2)
            return power(base, exponent)
        return base

    def postfix(self) -> Value:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            value = factorial(value)
        return value

    def group(self) -> Value:
        token = self.peek()
        if token in ("{", "("):
            return self.atom()
        if token is not None and token[0].isdigit() and "." not in token:  # \frac34
            self.take()
            digit, rest = token[0], token[1:]
            if rest:
                self.tokens.insert(self.pos, rest)
            return Fraction(int(digit))
        raise NotNumeric("a group was expected")

    def atom(self) -> Value:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return _literal(token)
        if token in ("(", "{", "["):
            value = self.expr()
            self.take(_OPEN[token])
            return value
        if token == "|":
            value = self.expr()
            self.take(token)
            return absolute(value)
        if token == "\\frac":
            numerator = self.group()
            return div(numerator, self.group())
        if token == "\\binom":
            n = self.group()
            return binomial(n, self.group())
        if token == "\\sqrt":
            index: Value = Fraction(2)
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
            return root(self.group(), index)
        raise NotNumeric(f"unexpected {token!r}")


def _literal(token: str) -> Fraction:
    digits = token.replace(".", "")
    if len(digits) > MAX_LITERAL_DIGITS:
        raise NotNumeric("literal too long")
    whole, _, decimals = token.partition(".")
    value = _int(whole or "0") + (Fraction(_int(decimals), 10 ** len(decimals)) if decimals else 0)
    return Fraction(value)


def _int(digits: str) -> int:
    """int() without Python's 4,300-digit limit (chunked: quadratic, but bounded by MAX_LITERAL_DIGITS)."""
    value = 0
    for i in range(0, len(digits), 4000):
        chunk = digits[i : i + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


# ----- arithmetic on exact values ------------------------------------------------------------------


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _factor(n: int) -> dict:
    """Prime factors of ``n > 0`` by trial division; a cofactor left over is kept as one base."""
    factors: dict = {}
    for p in (2, 3, 5, 7):
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
    p = 11
    while p * p <= n and p <= _TRIAL_PRIMES_UP_TO:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def _monomial(x: Fraction) -> tuple[Key, Fraction]:
    """A nonzero rational as (key, sign): its prime factorisation with signed exponents."""
    powers = dict(_factor(abs(x.numerator)))
    for p, e in _factor(x.denominator).items():
        powers[p] = powers.get(p, 0) - e
    powers.pop(1, None)
    return _key(powers), Fraction(1 if x > 0 else -1)


def _key(powers: dict) -> Key:
    return tuple(sorted(((b, e) for b, e in powers.items() if e != 0), key=_order))


def _order(item: tuple) -> int:
    """A sort key that is the same for equal items (never repr: exponents may have 10^5 digits)."""
    return hash(item[0])


def _as_huge(x: Value) -> Huge:
    if isinstance(x, Huge):
        return x
    if x == 0:
        return Huge({})
    key, sign = _monomial(x)
    return Huge({key: sign})


def _settle(x: Huge) -> Value:
    """A Huge that fits back into a Fraction becomes one; single terms fold their coefficient in."""
    if not x.terms:
        return Fraction(0)
    if len(x.terms) == 1:
        ((key, coefficient),) = x.terms.items()
        powers = dict(key)
        if abs(coefficient) != 1:
            for p, e in _monomial(coefficient)[0]:
                powers[p] = _add_exponents(powers.get(p, 0), e)
            key, coefficient = _key(powers), Fraction(1 if coefficient > 0 else -1)
        small = _small(key)
        if small is not None:
            return coefficient * small
        return Huge({key: coefficient})
    return x


def _add_exponents(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    total = add(Fraction(a) if isinstance(a, int) else a, Fraction(b) if isinstance(b, int) else b)
    return int(total) if isinstance(total, Fraction) and total.denominator == 1 else total


def _small(key: Key) -> Fraction | None:
    """The value of a term's key when it fits in MAX_BITS, else None."""
    estimate = 0
    for base, e in key:
        if not isinstance(base, int) or not isinstance(e, int):
            return None
        estimate += abs(e) * base.bit_length()
        if estimate > MAX_BITS:
            return None
    value = Fraction(1)
    for base, e in key:
        value *= Fraction(base) ** e
    return value


def add(a: Value, b: Value) -> Value:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return _checked(a + b)
    terms = dict(_as_huge(a).terms)
    for key, c in _as_huge(b).terms.items():
        terms[key] = terms.get(key, 0) + c
    return _settle(Huge(_merge_small(terms)))


def _merge_small(terms: dict[Key, Fraction]) -> dict[Key, Fraction]:
    """Terms whose keys have small values are summed into one rational term."""
    total, big = Fraction(0), dict[Key, Fraction]()
    for key, c in terms.items():
        small = _small(key)
        if small is None:
            big[key] = big.get(key, 0) + c
        else:
            total += c * small
    if total:
        key, sign = _monomial(total)
        big[key] = big.get(key, 0) + sign * 1
    return {k: c for k, c in big.items() if c}


def neg(a: Value) -> Value:
    return -a if isinstance(a, Fraction) else Huge({k: -c for k, c in a.terms.items()})


def mul(a: Value, b: Value) -> Value:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return _checked(a * b)
    if a == 0 or b == 0:
        return Fraction(0)
    x, y = _as_huge(a), _as_huge(b)
    if len(x.terms) != 1 or len(y.terms) != 1:
        raise NotNumeric("product of huge sums")
    ((kx, cx),) = x.terms.items()
    ((ky, cy),) = y.terms.items()
    powers = dict(kx)
    for base, e in ky:
        powers[base] = _add_exponents(powers.get(base, 0), e)
    return _settle(Huge({_key(powers): cx * cy}))


def div(a: Value, b: Value) -> Value:
    if b == 0:
        raise NotNumeric("division by zero")
    return mul(a, power(b, Fraction(-1)))


def _checked(x: Fraction) -> Fraction:
    if _bits(x) > MAX_BITS:
        raise NotNumeric("intermediate too large")  # never reached by products of huge forms
    return x


def power(base: Value, exponent: Value) -> Value:
    if isinstance(exponent, Fraction) and exponent.denominator != 1:
        return root(power(base, Fraction(exponent.numerator)), Fraction(exponent.denominator))
    if isinstance(base, Huge):
        if not isinstance(exponent, Fraction):
            raise NotNumeric("huge to a huge power")
        ((key, c),) = _single(base)
        n = int(exponent)
        powers = {b: _scale(e, n) for b, e in key}
        return _settle(Huge({_key(powers): c**n}))
    if base == 0:
        if isinstance(exponent, Fraction) and exponent < 0:
            raise NotNumeric("division by zero")
        return Fraction(1) if exponent == 0 else Fraction(0)
    if abs(base) == 1:
        if isinstance(exponent, Huge):
            raise NotNumeric("sign of (-1)^huge")
        return base ** int(exponent)
    if isinstance(exponent, Fraction):
        n = int(exponent)
        if abs(n) * _bits(base) <= MAX_BITS:
            return base**n
        key, sign = _monomial(base)
        return _settle(Huge({_key({b: e * n for b, e in key}): sign**n}))
    # a huge exponent: the result is an opaque atom per prime root of a positive integer base
    if base < 0 or base.denominator != 1:
        raise NotNumeric("huge power of a negative or fractional base")
    key, _ = _monomial(base)
    powers = {}
    for prime, e in key:
        powers[("pow", prime, _as_huge(_scale(exponent, e)).key())] = 1
    return Huge({_key(powers): Fraction(1)})


def _single(x: Huge):
    if len(x.terms) != 1:
        raise NotNumeric("power of a huge sum")
    return list(x.terms.items())


def _scale(e, n: int):
    """An exponent (int or Huge) times an integer."""
    if isinstance(e, int):
        return e * n
    return mul(e, Fraction(n))


def root(x: Value, index: Value) -> Value:
    if not isinstance(index, Fraction) or index.denominator != 1 or index < 2 or isinstance(x, Huge):
        raise NotNumeric("root")
    n = int(index)
    if x < 0 and n % 2 == 0:
        raise NotNumeric("even root of a negative number")
    num, den = _int_root(abs(x.numerator), n), _int_root(x.denominator, n)
    if num is None or den is None:
        raise NotNumeric("irrational root")
    value = Fraction(num, den)
    return -value if x < 0 else value


def _int_root(n: int, k: int) -> int | None:
    if n.bit_length() > MAX_BITS:
        return None
    r = round(n ** (1 / k)) if n.bit_length() < 1000 else _int_root_newton(n, k)
    for candidate in (r - 1, r, r + 1):
        if candidate >= 0 and candidate**k == n:
            return candidate
    return None


def _int_root_newton(n: int, k: int) -> int:
    x = 1 << ((n.bit_length() + k - 1) // k)
    while True:
        y = ((k - 1) * x + n // x ** (k - 1)) // k
        if y >= x:
            return x
        x = y


def factorial(x: Value) -> Value:
    if isinstance(x, Huge) or x.denominator != 1 or x < 0:
        raise NotNumeric("factorial of a non-natural number")
    n = int(x)
    if n <= MAX_FACTORIAL:
        return Fraction(math.factorial(n))
    return Huge({(((("fact", n)), 1),): Fraction(1)})


def binomial(n: Value, k: Value) -> Value:
    if not (isinstance(n, Fraction) and isinstance(k, Fraction)):
        raise NotNumeric("binomial")
    if n.denominator != 1 or k.denominator != 1 or n < 0 or k < 0 or n > 10**6:
        raise NotNumeric("binomial")
    return Fraction(math.comb(int(n), int(k)))


def absolute(x: Value) -> Value:
    if isinstance(x, Huge):
        raise NotNumeric("absolute value of a huge sum")
    return abs(x)


# ----- public --------------------------------------------------------------------------------------

_CHEAP = re.compile(r"^[\d\s.+\-*/(){}^!\\a-z\[\]|]*$")


def value(text: str) -> Value | None:
    """The exact value of an arithmetic answer, or None when it is not one."""
    if not text or not _CHEAP.match(text):
        return None
    try:
        return _Parser(drop_redundant_groups(_tokens(text))).parse()
    except (NotNumeric, ZeroDivisionError, OverflowError, ValueError, IndexError, RecursionError):
        return None


def _term_log10(key: Key) -> float:
    total = 0.0
    for base, e in key:
        if isinstance(base, tuple):  # an opaque atom: ("pow", prime, exponent key) or ("fact", n)
            if base[0] == "fact":
                total += math.lgamma(base[1] + 1) / math.log(10)
            else:
                return math.inf
        elif isinstance(e, int):
            total += e * math.log10(base) if e.bit_length() < 1000 else math.copysign(math.inf, e)
        else:
            return math.inf
    return total


def equal(a: Value, b: Value) -> bool | None:
    """Exact equality; None when the difference of two huge forms cannot be decided."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    difference = add(a, neg(b))
    if isinstance(difference, Fraction):
        return difference == 0
    terms = list(difference.terms.items())
    if len(terms) == 1:
        return False  # one nonzero term is nonzero
    if len(terms) == 2:  # c1 K1 + c2 K2 = 0 exactly when K1 / K2 is the rational -c2 / c1
        (k1, c1), (k2, c2) = terms
        ratio = div(Huge({k1: Fraction(1)}), Huge({k2: Fraction(1)}))
        return False if isinstance(ratio, Huge) else ratio == -c2 / c1
    sizes = sorted((_term_log10(k) + math.log10(abs(c)) for k, c in terms), reverse=True)
    if sizes[0] - sizes[1] > math.log10(len(terms)) + 1:  # one term outweighs the rest
        return False
    return None
