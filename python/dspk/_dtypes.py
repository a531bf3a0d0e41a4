"""numpy dtypes and the protocol's dtype names, bfloat16 included."""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from ._errors import DtypeError, InvalidArgument

__all__ = ["bfloat16", "to_bfloat16", "from_bfloat16", "wire_name", "numpy_dtype",
           "DTYPES"]

#: numpy has no bfloat16: dspk.bfloat16 is a 2-byte numpy dtype (one little-endian
#: uint16 field named "bf16" holding the raw bits) that marks an array as bf16 on the
#: wire.  Make one with :func:`to_bfloat16`, read one with :func:`from_bfloat16`.
#: Arrays of ml_dtypes' ``bfloat16`` are accepted too, where that package is installed.
bfloat16: np.dtype = np.dtype([("bf16", "<u2")])

#: The protocol's dtype names and their numpy dtypes (all little-endian).
DTYPES: Dict[str, np.dtype] = {
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
    "c64": np.dtype("<c8"),
    "c128": np.dtype("<c16"),
    "f16": np.dtype("<f2"),
    "bf16": bfloat16,
}

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
    """The numpy dtype of a protocol dtype name ("bf16" gives dspk.bfloat16)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise DtypeError("the daemon sent unknown dtype %r" % (name,)) from None


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


def to_bfloat16(x: Any) -> np.ndarray:
    """A dspk.bfloat16 array of ``x`` (real numbers; rounded to nearest even; NaN stays
    NaN), of x's shape (0-d too)."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:  # a ragged list
        raise InvalidArgument("to_bfloat16: not an array: %s" % e) from None
    if a.dtype.kind not in "fiu" or a.dtype.names is not None:
        # complex would lose its imaginary part, None and str are no numbers
        raise DtypeError("to_bfloat16: dtype %s (want real numbers)" % a.dtype)
    # np.ascontiguousarray makes a 0-d array 1-d: the shape comes from a.
    if a.dtype.kind == "f" and a.dtype.itemsize <= 4:
        f = np.ascontiguousarray(a, dtype="<f4").reshape(-1)  # exact
        u = f.view("<u4").astype(np.uint64)
    else:
        f, u = _f32_round_to_odd(np.ascontiguousarray(a, dtype="<f8").reshape(-1))
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(f)
    bits = np.where(nan, (u >> 16) | 0x40, rounded).astype("<u2")
    return bits.view(bfloat16).reshape(a.shape)


def from_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values of a bfloat16 array (dspk.bfloat16 or ml_dtypes.bfloat16), of its
    shape (0-d too)."""
    a = np.asarray(x)
    if not (a.dtype == bfloat16 or (a.dtype.name == "bfloat16" and a.dtype.itemsize == 2)):
        # another 2-byte dtype (float16, int16) would be read as bf16 bits
        raise DtypeError("from_bfloat16: dtype %s is not a bfloat16" % a.dtype)
    bits = np.ascontiguousarray(a).reshape(-1).view("<u2")
    return (bits.astype("<u4") << 16).view("<f4").reshape(a.shape)
