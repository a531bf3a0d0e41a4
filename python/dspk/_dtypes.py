"""numpy dtypes and the protocol's dtype names, bfloat16 included."""
from __future__ import annotations

import functools
import math
import numbers
import types
from typing import Any, Callable, Mapping, Optional, Tuple, TypeVar

import numpy as np

from ._errors import (DtypeError, Error, InvalidArgument, OutOfMemory, ProtocolError, _describe,
                      _from_signal_handler as from_signal_handler)

__all__ = ["bfloat16", "to_bfloat16", "from_bfloat16", "wire_name", "numpy_dtype",
           "DTYPES"]

#: numpy has no bfloat16: dspk.bfloat16 is a 2-byte numpy dtype (one little-endian
#: uint16 field named "bf16" holding the raw bits) that marks an array as bf16 on the
#: wire.  Make one with :func:`to_bfloat16`, read one with :func:`from_bfloat16`.
#: Arrays of ml_dtypes' ``bfloat16`` are accepted too, where that package is installed.
bfloat16: np.dtype = np.dtype([("bf16", "<u2")])

_T = TypeVar("_T")


def user_code(what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """fn(*args) calling into an object of the caller's (numpy converting it runs its
    ``__array__``, ``__len__``, ``__getitem__``...; ``int()`` its ``__index__``...):
    any Exception that raises is dspk.InvalidArgument naming ``what`` and the
    exception (chained as its ``__cause__``).  A MemoryError (numpy, or the object,
    could not allocate) is dspk.OutOfMemory (python.md), chained as well.  A dspk.Error
    passes as it is, and so do a signal handler's exception and one that is no
    Exception (KeyboardInterrupt)."""
    try:
        return fn(*args, **kwargs)
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - the object's own: named, chained
        if from_signal_handler(e):
            raise
        if isinstance(e, MemoryError):
            raise OutOfMemory("%s: %s" % (what, _describe(e))) from e
        raise InvalidArgument("%s: %s" % (what, _describe(e))) from e


_REFUSED = (np.ma.MaskedArray, np.matrix)
_NESTED = (list, tuple)
# How deep as_ndarray looks into nested lists and tuples: numpy takes no more
# dimensions than this (NPY_MAXDIMS is 32 in numpy 1, 64 in numpy 2), so a deeper
# one is refused by numpy itself (and a list that holds itself ends the look).
_NEST_MAX = 64


def _refused_inside(seq: Any, depth: int = 0) -> Optional[Tuple[str, Any]]:
    """The first element (its index path "[i][j]", and itself) of nested lists and
    tuples that is a numpy.ma.MaskedArray or a numpy.matrix; None when none is.  A
    level whose element types (set(map(type, ...)), C code) hold neither these nor a
    list or tuple is not walked in Python: a long flat list costs little."""
    if depth >= _NEST_MAX:
        return None
    kinds = set(map(type, seq))
    if not any(issubclass(k, _REFUSED) or issubclass(k, _NESTED) for k in kinds):
        return None
    for i, e in enumerate(seq):
        if isinstance(e, _REFUSED):
            return "[%d]" % i, e
        if isinstance(e, _NESTED):
            got = _refused_inside(e, depth + 1)
            if got is not None:
                return "[%d]%s" % (i, got[0]), got[1]
    return None


def _refusal(x: Any, what: str) -> InvalidArgument:
    if isinstance(x, np.ma.MaskedArray):
        return InvalidArgument("%s: a numpy.ma.MaskedArray (dspk computes on plain arrays: "
                               "its mask would be ignored): pass x.filled(value) or "
                               "x.compressed()" % what)
    return InvalidArgument("%s: a numpy.matrix (dspk computes on plain arrays and "
                           "gives plain arrays back): pass numpy.asarray(x)" % what)


def as_ndarray(x: Any, what: str) -> np.ndarray:
    """``numpy.asarray(x)`` for an operand named ``what``.  A numpy.ma.MaskedArray
    (numpy.asarray drops its mask: the values under it would be computed with) and a
    numpy.matrix (always 2-D: its reductions keep the axis, dspk's results would not)
    are dspk.InvalidArgument, as the operand or as an element of it, in nested lists
    and tuples (numpy.asarray drops the mask there too: probe 22 C4), and so is
    anything numpy fails to convert (user_code)."""
    if isinstance(x, _REFUSED):
        raise _refusal(x, what)
    if isinstance(x, _NESTED):
        got = _refused_inside(x)
        if got is not None:
            raise _refusal(got[1], "%s: element %s" % (what, got[0]))
    return user_code("%s: not an array" % what, np.asarray, x)


#: The protocol's dtype names and their numpy dtypes (all little-endian).  A read-only
#: mapping: the client decodes the daemon's answers by it, so an assignment would make
#: it read every result of that dtype as another.
DTYPES: Mapping[str, np.dtype] = types.MappingProxyType({
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
    "c64": np.dtype("<c8"),
    "c128": np.dtype("<c16"),
    "f16": np.dtype("<f2"),
    "bf16": bfloat16,
})

_KIND_NAMES = {("f", 4): "f32", ("f", 8): "f64", ("c", 8): "c64", ("c", 16): "c128",
               ("f", 2): "f16"}


def wire_name(dtype: Any) -> str:
    """The protocol's name of a numpy dtype ("f32", ...); DtypeError if it has none."""
    dt = np.dtype(dtype)
    if dt == bfloat16 or (dt.name == "bfloat16" and dt.itemsize == 2):
        return "bf16"
    name = _KIND_NAMES.get((dt.kind, dt.itemsize))
    if name is None:
        raise DtypeError("dtype %s has no dspk equivalent (float32, float64, complex64, "
                         "complex128, float16, dspk.bfloat16)" % dt)
    return name


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a protocol dtype name in a daemon's answer ("bf16" gives
    dspk.bfloat16); ProtocolError for another name (an answer the client cannot
    decode, not a dtype of the caller's)."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError) as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        raise ProtocolError("the daemon sent unknown dtype %r" % (name,)) from None


def _f32_round_to_odd(d: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """float32 of float64 values rounded to odd (an inexact value keeps the truncated
    bits with the last one set), as float32 and as their bits in uint64: rounding that
    to nearest even at bf16's 7 bits gives what rounding d there directly gives (numpy's
    float32 rounds to nearest even, and a second rounding of it could land on a tie
    that d was not on: 1 + 2**-8 + 2**-30 became 1.0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = d.astype("<f4")
    u = f.view("<u4").astype(np.uint64)
    back = f.astype("<f8")
    inexact = (back != d) & np.isfinite(d)
    # rounded away from zero (past FLT_MAX to inf too): one step back towards it
    u -= (inexact & (np.abs(back) > np.abs(d))).astype(np.uint64)
    u |= inexact.astype(np.uint64)
    return f, u


def _bit_length(m: np.ndarray) -> np.ndarray:
    """The bit length of each uint64 of ``m`` (0 for 0), exactly."""
    n = np.zeros(m.shape, np.uint64)
    x = m.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        big = (x >> np.uint64(shift)) != 0
        n += big.astype(np.uint64) * np.uint64(shift)
        x = np.where(big, x >> np.uint64(shift), x)
    return n + (x != 0).astype(np.uint64)


def _f64_round_to_odd_ints(a: np.ndarray) -> np.ndarray:
    """float64 of 64-bit integers rounded to odd at float64's 53 bits (the truncated
    significand, its last bit set when bits were dropped), computed with integers: a
    float64 conversion would round to nearest, and a second rounding of that could
    land on a tie the integer was not on (2**62 + 2**54 + 1)."""
    u = a.astype(np.uint64)
    neg = a < 0 if a.dtype.kind == "i" else np.zeros(a.shape, bool)
    m = np.where(neg, ~u + np.uint64(1), u)  # |a|, 2**63 included
    s = np.maximum(_bit_length(m).astype(np.int64) - 53, 0).astype(np.uint64)
    t = m >> s
    dropped = (m & ((np.uint64(1) << s) - np.uint64(1))) != 0
    t |= dropped.astype(np.uint64)
    d = np.ldexp(t.astype(np.float64), s.astype(np.int64))  # t < 2**53: exact
    return np.where(neg, -d, d)


def _f64_round_to_odd_wide(a: np.ndarray) -> np.ndarray:
    """float64 of floats wider than float64 (numpy.longdouble) rounded to odd at
    float64's precision, for the reason of _f64_round_to_odd_ints (1 + 2**-8 + 2**-60
    became 1 + 2**-8, a tie, then 1.0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        d = a.astype(np.float64)
    back = d.astype(a.dtype)
    inexact = (back != a) & np.isfinite(a)
    toward = inexact & (np.abs(back) > np.abs(a))  # rounded away from zero (inf too)
    d = np.where(toward, np.nextafter(d, np.zeros_like(d)), d)
    bits = d.view(np.uint64) | inexact.astype(np.uint64)
    return bits.view(np.float64)


def _python_reals(a: np.ndarray) -> np.ndarray:
    """An object array of Python numbers (ints beyond 64 bits: numpy.asarray([2**70]),
    fractions.Fraction, floats) as float64 rounded to odd, each from its exact value;
    DtypeError for anything else (bool, complex, str, None, Decimal: a bool among
    numbers is taken for a mistake; an array of bools converts, in to_bfloat16)."""
    flat = a.reshape(-1)
    out = np.empty(flat.shape, np.float64)
    for i, v in enumerate(flat):
        if isinstance(v, np.ndarray) and v.ndim == 0:
            # A 0-d array among the elements of a list (numpy.asarray takes its one
            # value, [np.array(1.0), 2.0] is [1., 2.]): converted from that value,
            # under the rules of a scalar of its type.
            v = v[()]
        if isinstance(v, (float, np.floating)):
            if not np.isfinite(v) or v == 0:  # -0.0 keeps its sign (its ratio is 0/1)
                out[i] = float(v)
                continue
            n, d = v.as_integer_ratio()
        elif isinstance(v, numbers.Rational) and not isinstance(v, (bool, np.bool_)):
            n, d = int(v.numerator), int(v.denominator)
        else:
            raise DtypeError("to_bfloat16: dtype object holding a %s (want real numbers)"
                             % type(v).__name__)
        m = abs(n)
        if m == 0:
            out[i] = 0.0
            continue
        # t = m/d * 2**k truncated, of 53 or 54 bits, the rest kept as a sticky bit
        k = 53 - (m.bit_length() - d.bit_length())
        t, r = divmod(m << k if k >= 0 else m, d if k >= 0 else d << -k)
        while t.bit_length() > 53:
            r |= t & 1
            t >>= 1
            k -= 1
        if r:
            t |= 1
        try:
            x = math.ldexp(float(t), -k)  # exact (but below float64's normal range,
            # far below bf16's smallest subnormal, where it rounds to 0 all the same)
        except OverflowError as e:  # beyond float64: bf16's infinity all the same
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            x = math.inf
        out[i] = -x if n < 0 else x
    return out.reshape(a.shape)


def _no_memory(fn: Callable[..., _T]) -> Callable[..., _T]:
    """A public helper whose numpy could not allocate an array: dspk.OutOfMemory
    (python.md, Errors), chained, not a bare MemoryError."""
    @functools.wraps(fn)
    def helper(*args: Any, **kwargs: Any) -> _T:
        try:
            return fn(*args, **kwargs)
        except MemoryError as e:
            if isinstance(e, Error) or from_signal_handler(e):
                raise
            raise OutOfMemory("%s: no memory for an array here: %s"
                              % (fn.__name__, e or "MemoryError")) from e
    return helper


@_no_memory
def to_bfloat16(x: Any) -> np.ndarray:
    """A dspk.bfloat16 array of ``x`` (real numbers; rounded to nearest even, once,
    from the exact value of every input type: floats up to numpy.longdouble, integers
    of any width, Python ints beyond 64 bits and fractions.Fraction too; NaN stays
    NaN, -0.0 keeps its sign; an array of bools is 0.0 and 1.0), of x's shape (0-d
    too).  Complex, str or None, or a bool among numbers: DtypeError."""
    a = as_ndarray(x, "to_bfloat16")
    if a.dtype.kind == "f" and not isinstance(x, (np.ndarray, np.generic)):
        # A sequence whose elements numpy promoted to one float dtype: an int among
        # floats (or a float16 among float64s...) became that float, rounded once
        # already.  Each element converted from its own exact value instead.
        try:
            o = user_code("to_bfloat16: not an array", np.asarray, x, dtype=object)
        except InvalidArgument as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            o = None
        if o is not None and o.shape == a.shape and \
                any(type(v) is not a.dtype.type and
                    not (type(v) is float and a.dtype == np.float64) for v in o.flat):
            a = o
    if a.dtype.kind == "O":
        a = _python_reals(a)  # Python ints beyond 64 bits; other objects: DtypeError
    if a.dtype.kind == "b":
        a = a.astype(np.float32)  # False 0.0, True 1.0 (as numpy converts bools)
    if a.dtype.kind not in "fiu" or a.dtype.names is not None:
        # complex would lose its imaginary part, None and str are no numbers
        raise DtypeError("to_bfloat16: dtype %s (want real numbers)" % a.dtype)
    # np.ascontiguousarray makes a 0-d array 1-d: the shape comes from a.
    flat = np.ascontiguousarray(a).reshape(-1)
    if a.dtype.kind == "f" and a.dtype.itemsize <= 4:
        f = np.ascontiguousarray(flat, dtype="<f4")  # exact
        u = f.view("<u4").astype(np.uint64)
    else:
        # Every value rounded to odd at float64's precision first (exact for float64
        # and integers of up to 32 bits), then to odd at float32's: rounding that to
        # nearest even at bf16's 8 bits gives what rounding the exact value gives.
        if a.dtype.kind in "iu" and a.dtype.itemsize == 8:
            d = _f64_round_to_odd_ints(flat)
        elif a.dtype.kind == "f" and a.dtype.itemsize > 8:
            d = _f64_round_to_odd_wide(flat)
        else:
            d = np.ascontiguousarray(flat, dtype="<f8")
        f, u = _f32_round_to_odd(d)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(f)
    bits = np.where(nan, (u >> 16) | 0x40, rounded).astype("<u2")
    return bits.view(bfloat16).reshape(a.shape)


@_no_memory
def from_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values of a bfloat16 array (dspk.bfloat16 or ml_dtypes.bfloat16), of its
    shape (0-d too)."""
    a = as_ndarray(x, "from_bfloat16")
    if not (a.dtype == bfloat16 or (a.dtype.name == "bfloat16" and a.dtype.itemsize == 2)):
        # another 2-byte dtype (float16, int16) would be read as bf16 bits
        raise DtypeError("from_bfloat16: dtype %s is not a bfloat16" % a.dtype)
    bits = np.ascontiguousarray(a).reshape(-1).view("<u2")
    return (bits.astype("<u4") << 16).view("<f4").reshape(a.shape)
