"""What an outsider passes that docs/python.md does not forbid: parameters of another
type, operands numpy cannot make an array of, out= of the wrong kind, connect()'s
arguments.  Each is a dspk.Error naming the parameter (or the documented TypeError of
a bad call), raised before anything is sent; the connection stays usable."""
from __future__ import annotations

import fractions
import inspect
import math
import numbers
import os
import pathlib
import re
import typing

import numpy as np
import pytest

import dspk
from conftest import TIMEOUT

RNG = np.random.default_rng(11)


def f64(*shape):
    return RNG.uniform(-1, 1, shape)


# ---- scalar parameters ---------------------------------------------------------------

# (call, parameter): each call takes the bad value v for that parameter.  float() and
# bool() took "2", True or "no" and sent what the caller did not mean; a complex alpha
# or None failed inside float() with a bare TypeError.
A, B = f64(3, 4), f64(4, 2)
SCALARS = [
    (lambda c, v: c.gemm(A, B, alpha=v), "alpha"),
    (lambda c, v: c.gemm(A, B, f64(3, 2), beta=v), "beta"),
    (lambda c, v: c.map("scale", A, alpha=v), "alpha"),
    (lambda c, v: c.map("axpy", A, A, alpha=v), "alpha"),
]
FLAGS = [
    (lambda c, v: c.gemm(A, A.T.copy(), trans_a=v, trans_b=v), "trans_a"),
    (lambda c, v: c.fft(f64(8).astype(np.complex128), inverse=v), "inverse"),
]
STRINGS = [
    (lambda c, v: c.map(v, A), "fn"),
    (lambda c, v: c.reduce(A, v), "fn"),
    (lambda c, v: c.contract(v, A, B), "subscripts"),
]


@pytest.mark.parametrize("call,name", SCALARS)
@pytest.mark.parametrize("bad", ["2", True, np.bool_(False), None, 1j, [1.0], b"1"])
def test_number_parameters_refuse_other_types(client, call, name, bad):
    if name == "beta" and bad is None:
        pytest.skip("beta=None is gemm's default (1.0 with c, 0.0 without)")
    with pytest.raises(dspk.InvalidArgument) as e:
        call(client, bad)
    assert e.value.message.startswith(name + ": expected a real number"), e.value.message
    client.ping()


@pytest.mark.parametrize("call,name", FLAGS)
@pytest.mark.parametrize("bad", ["yes", "false", 2, 0.0, None])
def test_bool_parameters_refuse_other_types(client, call, name, bad):
    with pytest.raises(dspk.InvalidArgument) as e:
        call(client, bad)
    assert e.value.message.startswith(name + ": expected a bool"), e.value.message


@pytest.mark.parametrize("call,name", STRINGS)
@pytest.mark.parametrize("bad", [3, b"sum", None])
def test_str_parameters_refuse_other_types(client, call, name, bad):
    with pytest.raises(dspk.InvalidArgument) as e:
        call(client, bad)
    assert e.value.message.startswith(name + ": expected a str"), e.value.message


def test_numeric_types_that_are_numbers(client):
    """numpy scalars and ints are numbers; numpy bools and 0/1 are flags."""
    a, b = A.astype(np.float32), B.astype(np.float32)
    for alpha in (2, np.float32(2), np.float64(2), np.int64(2)):
        np.testing.assert_allclose(client.gemm(a, b, alpha=alpha), 2 * a @ b, rtol=1e-5)
        np.testing.assert_allclose(client.map("scale", a, alpha=alpha), 2 * a, rtol=1e-6)
    for flag in (np.bool_(True), 1):
        np.testing.assert_allclose(client.gemm(a, a, trans_b=flag), a @ a.T, rtol=1e-5)
    np.testing.assert_allclose(client.gemm(a, a.T.copy(), trans_a=0), a @ a.T, rtol=1e-5)


def test_scalars_rounded_once_to_f32(client):
    """An int or longdouble alpha/beta/{f32: v} is rounded once, from its exact value, to
    the f32 an f32 op uses (it went through float64 first: 2**53 + 2**29 + 1 became the
    tie 2**53 + 2**29, then 2**53, not the nearest f32 2**53 + 2**30); an f64 op takes
    the nearest float64."""
    one32, one64 = np.ones((1, 1), np.float32), np.ones((1, 1), np.float64)
    ld = np.longdouble(1) + np.longdouble(2) ** -24 + np.longdouble(2) ** -60
    if float(ld) == 1 + 2.0 ** -24:  # a longdouble wider than float64 (not on aarch64...)
        cases = [(2 ** 53 + 2 ** 29 + 1, 2.0 ** 53 + 2 ** 30), (ld, 1 + 2.0 ** -23)]
    else:
        cases = [(2 ** 53 + 2 ** 29 + 1, 2.0 ** 53 + 2 ** 30)]
    cases += [(np.uint64(2 ** 53 + 2 ** 29 + 1), 2.0 ** 53 + 2 ** 30),
              (2 ** 70 + 2 ** 46 + 1, 2.0 ** 70 + 2 ** 47),  # beyond 64 bits
              (-(2 ** 70 + 2 ** 46 + 1), -(2.0 ** 70 + 2 ** 47))]
    for v, want in cases:
        assert client.map("scale", one32, alpha=v, device="cpu:0")[0, 0] == want, v
        assert client.gemm(one32, one32, alpha=v, device="cpu:0")[0, 0] == want, v
        assert client.gemm(one32, one32, one32, alpha=0, beta=v, device="cpu:0")[0, 0] == want
        assert client.map("scale", one64, alpha=v, device="cpu:0")[0, 0] == float(v), v
        assert client.gemm(one64, one64, alpha=v, device="cpu:0")[0, 0] == float(v), v
    args = dspk._client._kernel_args([{"f32": 2 ** 70 + 2 ** 46 + 1}, {"f64": 2 ** 70 + 1},
                                      {"f32": 5}])
    assert args == [{"f32": 2.0 ** 70 + 2 ** 47}, {"f64": float(2 ** 70)}, {"f32": 5}], args


class _Real(numbers.Real):
    """A real number of another library (as gmpy2's and sympy's register themselves):
    numbers.Real with __float__, and as_integer_ratio() when ``exact``."""

    def __init__(self, v, exact=True):
        self.v = fractions.Fraction(v)
        if exact:
            self.as_integer_ratio = lambda: self.v.as_integer_ratio()

    def __float__(self):
        return float(self.v)

    # the rest of numbers.Real: unused by the client
    __abs__ = __add__ = __ceil__ = __eq__ = __floor__ = __floordiv__ = __le__ = \
        __lt__ = __mod__ = __mul__ = __neg__ = __pos__ = __pow__ = __radd__ = \
        __rfloordiv__ = __rmod__ = __rmul__ = __round__ = __rpow__ = __rtruediv__ = \
        __truediv__ = __trunc__ = lambda self, *a: NotImplemented


class _BadIndex(numbers.Integral):
    """An integer whose conversion fails."""

    def __index__(self):
        raise RuntimeError("no index")

    __int__ = __index__
    __abs__ = __add__ = __and__ = __ceil__ = __eq__ = __floor__ = __floordiv__ = \
        __invert__ = __le__ = __lshift__ = __lt__ = __mod__ = __mul__ = __neg__ = \
        __or__ = __pos__ = __pow__ = __radd__ = __rand__ = __rfloordiv__ = \
        __rlshift__ = __rmod__ = __rmul__ = __ror__ = __round__ = __rpow__ = \
        __rrshift__ = __rshift__ = __rtruediv__ = __rxor__ = __truediv__ = \
        __trunc__ = __xor__ = lambda self, *a: NotImplemented


def test_scalars_of_other_real_types(client):
    """A numbers.Real of another library worked on f64 ops and was refused on f32 ops
    with "DtypeError: to_bfloat16: dtype object holding a ..." (a function the caller
    never called); an Integral whose __index__ raises escaped as that bare exception.
    Now the value is rounded once from its exact value (as_integer_ratio()) where it
    has one, else through its float(); a failing conversion is InvalidArgument."""
    one32, one64 = np.ones((1, 1), np.float32), np.ones(1, np.float64)
    tie = 2 ** 53 + 2 ** 29 + 1  # nearest f32 2**53 + 2**30; through float64 2**53
    assert client.map("scale", one32, alpha=_Real(tie), device="cpu:0")[0, 0] == \
        2.0 ** 53 + 2 ** 30
    assert client.gemm(one32, one32, alpha=_Real(tie), device="cpu:0")[0, 0] == \
        2.0 ** 53 + 2 ** 30
    assert client.map("scale", one32, alpha=_Real(tie, exact=False),
                      device="cpu:0")[0, 0] == 2.0 ** 53  # its float(), then f32
    assert client.map("scale", one64, alpha=_Real(2.5), device="cpu:0")[0] == 2.5
    assert dspk._client._kernel_args([{"f32": _Real(tie)}]) == [{"f32": 2.0 ** 53 + 2 ** 30}]
    for dt in (np.float32, np.float64):
        with pytest.raises(dspk.InvalidArgument, match="^EINVAL: alpha: RuntimeError: no "
                                                       "index") as e:
            client.map("scale", np.ones(2, dt), alpha=_BadIndex())
        assert isinstance(e.value.__cause__, RuntimeError)
    assert client.ping() >= 0


class _Skewed(_Real):
    """A real of another library whose float() is not its value (0.5 for all): the
    value comes from as_integer_ratio(), or (``how="nd"``) from numerator and
    denominator attributes only, as a numbers.Real need not be a numbers.Rational."""

    def __init__(self, v, how="ratio"):
        super().__init__(v, exact=(how == "ratio"))
        if how == "nd":
            self.numerator, self.denominator = self.v.numerator, self.v.denominator

    def __float__(self):
        return 0.5


def test_scalars_of_other_real_types_at_their_exact_value(client):
    """A numbers.Real of another library was taken from its float() in the ops that
    compute in f64 (its as_integer_ratio() used for f32 ones only), and its numerator
    and denominator never (outside probe 15, C, 5), though python.md promises its exact
    value.  Now f32 and f64 ops, and a kernel's f32 and f64 args, round the exact value
    once (1/3 here, whose float() says 0.5); a ratio that is not two integers with a
    denominator of 1 or more is InvalidArgument."""
    one32, one64 = np.ones((1, 1), np.float32), np.ones((1, 1), np.float64)
    third = fractions.Fraction(1, 3)
    f32, f64 = float(np.float32(1) / np.float32(3)), 1 / 3  # both correctly rounded
    tie = 2 ** 53 + 2 ** 29 + 1  # f32: 2**53 + 2**30 (2**53 through float64)
    for how in ("ratio", "nd"):
        v = _Skewed(third, how)
        assert client.map("scale", one32, alpha=v, device="cpu:0")[0, 0] == f32, how
        assert client.gemm(one32, one32, alpha=v, device="cpu:0")[0, 0] == f32, how
        assert client.map("scale", one64, alpha=v, device="cpu:0")[0, 0] == f64, how
        assert client.gemm(one64, one64, alpha=v, device="cpu:0")[0, 0] == f64, how
        assert client.gemm(one64, one64, one64, alpha=0, beta=v,
                           device="cpu:0")[0, 0] == f64, how
        assert dspk._client._kernel_args([{"f32": v}, {"f64": v}]) == \
            [{"f32": f32}, {"f64": f64}], how
        assert client.map("scale", one32, alpha=_Skewed(tie, how),
                          device="cpu:0")[0, 0] == 2.0 ** 53 + 2 ** 30, how
        assert client.map("scale", one64, alpha=_Skewed(tie, how),
                          device="cpu:0")[0, 0] == float(tie), how  # not 0.5
        with pytest.raises(dspk.InvalidArgument, match="beyond what a float64 holds"):
            client.map("scale", one64, alpha=_Skewed(10 ** 400, how))
    bad = _Skewed(third, "nd")
    bad.denominator = 0
    with pytest.raises(dspk.InvalidArgument, match="not a denominator of 1 or more"):
        client.map("scale", one64, alpha=bad)
    bad.denominator = "3"
    with pytest.raises(dspk.InvalidArgument, match="not two ints"):
        client.map("scale", one64, alpha=bad)


def test_reduce_axes(client):
    x = f64(2, 3, 4)
    for axes, ref in ((1, 1), (np.int64(-1), -1), ([0, 2], (0, 2)), ((np.int32(0),), (0,)),
                      (np.array([2, 0]), (2, 0)), (np.array(1), 1)):
        np.testing.assert_allclose(client.reduce(x, "sum", axes), x.sum(axis=ref))
    # A bool, a float or a str was taken as an axis by int(): True reduced axis 1.
    for bad in (True, 1.0, "1", [0, 1.5], [np.bool_(True)], [None]):
        with pytest.raises(dspk.InvalidArgument) as e:
            client.reduce(x, "sum", bad)
        assert e.value.message.startswith("axes"), e.value.message
    with pytest.raises(dspk.InvalidArgument, match="axes: an empty sequence"):
        client.reduce(x, "sum", ())


# ---- operands ------------------------------------------------------------------------

class _Raising:
    """An operand whose conversion fails as a lazy array's read does (h5py, zarr, a
    memmap of a file gone): its __array__ raises ``exc``."""

    def __init__(self, exc):
        self.exc = exc

    def __array__(self, dtype=None, copy=None):
        raise self.exc


@pytest.mark.parametrize("exc", [OSError(5, "Input/output error"), RuntimeError("bad"),
                                 KeyError("k"), ValueError("bad"), IndexError(3)])
def test_an_operand_whose_conversion_raises_is_invalid_argument(client, exc):
    """Only a ValueError or TypeError of numpy's conversion became InvalidArgument; an
    OSError, RuntimeError, KeyError... of the operand's __array__ escaped bare.  Now
    every Exception of it is InvalidArgument naming the operand and the exception,
    which is chained as its __cause__, on every path that converts an operand."""
    x = np.ones(4)
    s = client.empty_shared(4, np.float64)
    calls = [
        ("input 1", lambda v: client.map("add", x, v)),
        ("input 0", lambda v: client.reduce(v)),
        ("input 1", lambda v: client.map("add", x, v, out=s)),
        ("input 0", lambda v: client.submit("reduce", v)),
        ("array", lambda v: client.to_device(v)),
        ("to_bfloat16", lambda v: dspk.to_bfloat16(v)),
        ("from_bfloat16", lambda v: dspk.from_bfloat16(v)),
    ]
    for what, call in calls:
        with pytest.raises(dspk.InvalidArgument, match="%s: not an array: %s" % (
                what, type(exc).__name__)) as e:
            call(_Raising(exc))
        assert e.value.__cause__ is exc
    assert client.ping() > 0 and \
        [x for x in client.status()["clients"] if x["self"]][0]["buffers"] == 1  # s


def test_an_operand_whose_conversion_runs_out_of_memory_is_out_of_memory(client):
    """A MemoryError of an operand's __array__ (a lazy array that cannot allocate) left
    reduce, to_device and to_bfloat16 bare, although python.md makes it
    dspk.OutOfMemory; a dspk.Error it raises passes as it is."""
    x = np.ones(4)
    calls = [lambda v: client.reduce(v), lambda v: client.map("add", x, v),
             lambda v: client.to_device(v), lambda v: client.submit("reduce", v).result(),
             lambda v: dspk.to_bfloat16(v), lambda v: dspk.from_bfloat16(v)]
    for call in calls:
        exc = MemoryError("cannot allocate")
        with pytest.raises(dspk.OutOfMemory, match="cannot allocate") as e:
            call(_Raising(exc))
        assert e.value.__cause__ is exc and e.value.name == "ENOMEM"
        busy = dspk.Busy("busy elsewhere")
        with pytest.raises(dspk.Busy) as e:
            call(_Raising(busy))
        assert e.value is busy
    assert client.ping() > 0


def test_connect_without_sys_argv(daemon, monkeypatch):
    """An embedded interpreter may have no sys.argv: connect() raised AttributeError
    making its default name; it is python:python, as for an empty argv."""
    monkeypatch.delattr("sys.argv")
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        me = [x for x in c.status()["clients"] if x["self"]][0]
        assert me["name"] == "python:python", me


def test_a_signal_handlers_exception_in_a_conversion_propagates(client):
    """A signal handler's exception that lands while numpy converts an operand is the
    caller's: it propagates as it is (python.md), not as InvalidArgument."""
    import signal

    class Alarm(Exception):
        pass

    def handler(signum, frame):
        raise Alarm()

    class Slow:
        def __array__(self, dtype=None, copy=None):
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs in this loop
            for _ in range(10 ** 7):
                pass
            raise AssertionError("the handler did not run")

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with pytest.raises(Alarm):
            client.reduce(Slow())
        with pytest.raises(Alarm):
            dspk.to_bfloat16(Slow())
    finally:
        signal.signal(signal.SIGUSR1, old)


class _BadNumber(float):
    """A real number whose conversions raise what its code raises."""

    def __float__(self):
        raise RuntimeError("no float")


class _BadInt(int):
    def __int__(self):
        raise RuntimeError("no int")

    __index__ = __int__


class _BadSeq:
    def __iter__(self):
        raise OSError(5, "Input/output error")


def test_a_parameter_whose_conversion_raises_is_invalid_argument(client):
    """The same for the other parameters the client converts by calling into the
    caller's object (float(), int(), iteration): InvalidArgument naming the parameter,
    not the object's bare exception."""
    x = np.ones((2, 3))
    cases = [
        ("alpha: RuntimeError: no float", lambda: client.map("scale", x, alpha=_BadNumber(2))),
        ("axes: RuntimeError: no int", lambda: client.reduce(x, "sum", _BadInt(1))),
        ("inverse: RuntimeError: no int", lambda: client.fft(x, inverse=_BadInt(1))),
        ("axes: OSError", lambda: client.reduce(x, "sum", _BadSeq())),
        ("shape: OSError", lambda: client.empty(_BadSeq())),
        ("args: OSError", lambda: client.kernel("void main(){}", x, lang="glsl",
                                                 args=_BadSeq(), grid=[1, 1, 1])),
    ]
    for match, call in cases:
        with pytest.raises(dspk.InvalidArgument, match=match) as e:
            call()
        assert isinstance(e.value.__cause__, (RuntimeError, OSError))
    assert client.ping() > 0


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # numpy.matrix's
@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_masked_arrays_and_matrices_are_refused(client, kind):
    """A numpy.ma.MaskedArray went through numpy.asarray, which drops its mask: the
    values under the mask were computed with (a sum of 1e30 where the masked sum is
    7), silently; a numpy.matrix lost its 2-D meaning (its sum(axis=1) is (n, 1)).
    Now both are InvalidArgument naming the operand, on every path that converts an
    operand (ops, submit, to_device, to_bfloat16, a shared array's view as out=)."""
    base = np.array([[1.0, 2.0], [1e30, 4.0]], np.float32)
    if kind == "masked":
        v = np.ma.masked_array(base, mask=[[0, 0], [1, 0]])
        match = "numpy.ma.MaskedArray"
    else:
        v = np.asmatrix(base)
        match = "numpy.matrix"
    calls = [
        ("input 0", lambda: client.reduce(v)),
        ("input 1", lambda: client.map("add", base, v)),
        ("input 0", lambda: client.submit("map", "exp", v)),
        ("array", lambda: client.to_device(v)),
        ("to_bfloat16", lambda: dspk.to_bfloat16(v)),
    ]
    for what, call in calls:
        with pytest.raises(dspk.InvalidArgument, match="%s: a %s" % (what, match)):
            call()
    s = client.empty_shared((2, 2))
    out = np.ma.masked_array(s, mask=[[0, 0], [1, 0]]) if kind == "masked" else np.asmatrix(s)
    with pytest.raises(dspk.InvalidArgument, match="out=: a %s" % match):
        client.map("abs", base, out=out)
    # a shared array's masked view or matrix as an operand: refused too (not sent as
    # a reference to its data)
    sv = np.ma.masked_array(s, mask=[[0, 0], [1, 0]]) if kind == "masked" else np.asmatrix(s)
    with pytest.raises(dspk.InvalidArgument, match="input 0: a %s" % match):
        client.reduce(sv)
    # its plain array (what the message says to pass) is taken
    assert client.reduce(np.asarray(v)) == pytest.approx(float(base.sum()), rel=1e-6)
    assert client.ping() > 0


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # numpy.matrix's
@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_masked_arrays_and_matrices_inside_lists_are_refused_too(client, kind):
    """The rule is the same for every operand form: a MaskedArray or a numpy.matrix as
    an element of a list or tuple operand (nested too) is InvalidArgument naming the
    operand and the element.  numpy.asarray([ma]) drops the mask as well, and a list
    was taken: reduce([ma]) summed the masked value in (6 where ma.sum() is 4), and
    to_bfloat16([ma]) and [np.matrix] passed (probe 22 C4)."""
    if kind == "masked":
        v = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
        match = "numpy.ma.MaskedArray"
    else:
        v = np.asmatrix([[1.0, 2.0, 3.0]])
        match = "numpy.matrix"
    calls = [
        ("input 0: element \\[0\\]", lambda: client.reduce([v])),
        ("input 0: element \\[1\\]\\[0\\]", lambda: client.reduce(([4.0, 5.0, 6.0], (v,)))),
        ("input 1: element \\[0\\]", lambda: client.map("add", [[1.0, 2.0, 3.0]], [v])),
        ("input 0: element \\[2\\]", lambda: client.submit("map", "exp", [[7.0, 8.0, 9.0], (1.0, 2.0, 3.0), v])),
        ("array: element \\[0\\]", lambda: client.to_device([v])),
        ("to_bfloat16: element \\[0\\]", lambda: dspk.to_bfloat16([v])),
        ("from_bfloat16: element \\[0\\]", lambda: dspk.from_bfloat16([v])),
    ]
    for what, call in calls:
        with pytest.raises(dspk.InvalidArgument, match="%s: a %s" % (what, match)):
            call()
    if kind == "masked":  # numpy's masked constant is a MaskedArray too
        with pytest.raises(dspk.InvalidArgument, match="element \\[1\\]: a numpy.ma"):
            client.reduce([1.0, np.ma.masked])
    # plain arrays, lists and tuples in a list are taken as numpy.asarray takes them
    assert client.reduce([np.asarray(v).ravel(), [1.0, 1.0, 1.0], (2.0, 2.0, 2.0)]) == \
        pytest.approx(float(np.asarray(v).sum()) + 9.0)
    assert client.reduce(list(np.arange(1000.0))) == pytest.approx(499500.0)
    nested = []
    nested.append(nested)  # a list that holds itself: numpy's own error, not a hang
    with pytest.raises(dspk.InvalidArgument, match="input 0: not an array"):
        client.reduce(nested)
    assert client.ping() > 0


def test_operands_numpy_cannot_take(client):
    """A ragged list raised numpy's bare ValueError; now InvalidArgument (still a
    ValueError) naming the input; a dtype error names the input too."""
    with pytest.raises(dspk.InvalidArgument, match="input 0: not an array"):
        client.map("abs", [[1.0], [1.0, 2.0]])
    with pytest.raises(dspk.InvalidArgument, match="input 1: not an array"):
        client.map("add", [1.0, 2.0], [[1.0], [1.0, 2.0]])
    with pytest.raises(dspk.DtypeError, match="input 1: dtype int64"):
        client.gemm(A, np.ones((4, 2), np.int64))
    with pytest.raises(dspk.DtypeError, match="array: dtype bool"):
        client.to_device(np.ones(3, bool))
    np.testing.assert_allclose(client.map("abs", [-1.0, 2.0]), [1.0, 2.0])  # a list is fine
    client.ping()


@pytest.mark.parametrize("dev", [None, 0, b"cpu:0", object(), ["cpu:0"], "cpu:\ud800"])
def test_device_is_checked_by_the_client(client, dev):
    """device=None was sent as no device (the daemon's default: cpu:0, also for
    empty_shared and submit), an int or bytes was refused by the daemon after a round
    trip, and an object by msgpack with a message naming the RPC method.  Now every
    method that takes ``device`` refuses one that is no str (or no UTF-8 text) with
    InvalidArgument naming ``device``, before anything is sent."""
    x = np.ones(4)
    calls = [
        lambda: client.map("exp", x, device=dev),
        lambda: client.gemm(A, B, device=dev),
        lambda: client.kernel("x", x, lang="glsl", grid=1, device=dev),
        lambda: client.empty(2, device=dev),
        lambda: client.to_device(x, device=dev),
        lambda: client.empty_shared(2, device=dev),
        lambda: client.submit("map", "exp", x, device=dev),
        lambda: client.submit("reduce", np.ones(1 << 18), device=dev),  # shared temporary
    ]
    sent = client._next_id
    for call in calls:
        with pytest.raises(dspk.InvalidArgument, match="^EINVAL: device: "):
            call()
    assert client._next_id == sent, "a request was sent"
    assert client.ping() > 0


def test_values_msgpack_cannot_carry(client):
    """An int beyond 64 bits, or an object, in a parameter passed through to the daemon
    raised msgpack's OverflowError/TypeError; now InvalidArgument, and the request it
    belonged to is not left pending."""
    with pytest.raises(dspk.InvalidArgument, match="cannot be sent"):
        client.kernel("x", A, lang="glsl", grid=1, args=[{"f16": object()}])
    with pytest.raises(dspk.InvalidArgument, match="cannot be sent"):
        client.kernel("x", A, lang="glsl", grid=1, args=[{"i16": 1 << 70}])
    assert not client._pending
    client.ping()


def test_kernel_arguments(client):
    """kernel's args, grid, block, shared and source, refused before anything is sent
    (no GPU needed: nothing reaches a device)."""
    x = np.zeros(4, np.float32)

    def k(**kw):
        opts = dict(lang="glsl", grid=1)
        opts.update(kw)
        return client.kernel("void main() {}", x, **opts)

    for kw, err, msg in (
            (dict(args=5), dspk.InvalidArgument, "options.args: expected a list"),
            (dict(args={"tensor": 0}), dspk.InvalidArgument, "options.args: expected a list"),
            (dict(args=[5]), dspk.InvalidArgument, "options.args[0]: expected a one-key dict"),
            (dict(args=[{"tensor": 0, "i32": 1}]), dspk.InvalidArgument, "options.args[0]: "),
            (dict(args=[{"i32": 1.5}]), dspk.InvalidArgument, "options.args[0]: expected an int"),
            (dict(args=[{"f32": "1"}]), dspk.InvalidArgument, "options.args[0]: expected a real"),
            (dict(args=[{"u32": 1 << 64}]), dspk.RangeError, "options.args[0]: 18446744073709551616"),
            (dict(args=[{"i64": -(1 << 63) - 1}]), dspk.RangeError, "options.args[0]"),
            # The value named, as for the ints (probe 19 F6: "int is out of f64 range"),
            # also past the 4300 digits str() of an int takes (it raised ValueError).
            (dict(args=[{"f64": 10**400}]), dspk.RangeError,
             "options.args[0]: 1e+400 is out of f64 range"),
            (dict(args=[{"f32": -3 * 10**400}]), dspk.RangeError,
             "options.args[0]: -3e+400 is out of f32 range"),
            (dict(args=[{"f64": fractions.Fraction(10**400, 3)}]), dspk.RangeError,
             "options.args[0]: 3.3333333333333333e+399 is out of f64 range"),
            (dict(args=[{"i64": 10**5000}]), dspk.RangeError,
             "options.args[0]: 1e+5000 is out of i64 range"),
            (dict(args=[{"u32": (1 << 128) - 1}]), dspk.RangeError,
             "options.args[0]: 340282366920938463463374607431768211455 is out of u32 range"),
            # A tensor index beyond msgpack's ints is no input's index either: EINVAL
            # as the daemon's for 5, -1 or 2**63 (probe 20 C4c: it was RangeError).
            (dict(args=[{"tensor": 1 << 64}]), dspk.InvalidArgument,
             "options.args[0]: tensor 18446744073709551616 is not an input index"),
            (dict(args=[{"tensor": -(1 << 63) - 1}]), dspk.InvalidArgument,
             "options.args[0]: tensor -9223372036854775809 is not an input index"),
            (dict(grid="2"), dspk.InvalidArgument, "grid: expected an integer"),
            (dict(grid=[1, 2.0]), dspk.InvalidArgument, "grid[1]: expected an integer"),
            (dict(block=True), dspk.InvalidArgument, "block: expected an integer"),
            (dict(shared=1.5), dspk.InvalidArgument, "shared: expected an integer"),
            (dict(lang=None), dspk.InvalidArgument, "lang: expected a str"),
            (dict(entry=5), dspk.InvalidArgument, "entry: expected a str")):
        with pytest.raises(err) as e:
            k(**kw)
        assert e.value.message.startswith(msg), (kw, e.value.message)
    with pytest.raises(dspk.InvalidArgument, match="source: expected a str or bytes"):
        client.kernel(5, x, lang="glsl", grid=1)
    # Past the client's checks, the daemon's: a finite f32 beyond f32's range is ERANGE
    # (it became an infinity), checked before the device.
    with pytest.raises(dspk.RangeError, match=r"options.args\[1\]: 1e\+39 is out of f32"):
        client.kernel("void main() {}", x, lang="glsl", grid=1, device="cpu:0",
                      args=[{"tensor": 0}, {"f32": 1e39}])
    client.ping()


def test_kernel_args_are_named_alike_by_the_client_and_the_daemon(client):
    """A value of kernel ``args`` out of its type's range was named ``args[4].f64``
    where the client refused it (beyond msgpack's ints, beyond float64) and
    ``options.args[2]`` where the daemon did (beyond the type's own range): now
    both name it as the daemon does (protocol.md), ``options.args[i]: V is out of T
    range``, and a tensor that is no input's index ``options.args[i]: tensor V is not
    an input index``, whichever side refuses it."""
    x = np.zeros(4, np.float32)

    def refusal(args):
        with pytest.raises(dspk.Error) as e:
            client.kernel("void main() {}", x, lang="glsl", grid=1, device="cpu:0",
                          args=[{"tensor": 0}] + args)
        return type(e.value), e.value.message

    client_side = [([{"u32": 1 << 64}], "18446744073709551616", "u32"),
                   ([{"i32": -(1 << 63) - 1}], "-9223372036854775809", "i32"),
                   ([{"i64": 1 << 64}], "18446744073709551616", "i64"),
                   ([{"f64": 10 ** 400}], "1e+400", "f64"),
                   ([{"f32": 10 ** 400}], "1e+400", "f32")]
    daemon_side = [([{"u32": -1}], "-1", "u32"), ([{"i32": 1 << 31}], "2147483648", "i32"),
                   ([{"i64": 1 << 63}], "9223372036854775808", "i64")]
    for args, text, kind in client_side + daemon_side:
        assert refusal(args) == (dspk.RangeError, "options.args[1]: %s is out of %s range"
                                 % (text, kind)), args
    for v in (1 << 64, 5, -1):  # the client's (beyond msgpack), the daemon's
        assert refusal([{"tensor": v}]) == (
            dspk.InvalidArgument, "options.args[1]: tensor %d is not an input index" % v)
    # A value of another type: named alike too (the daemon's "expected an integer")
    assert refusal([{"i32": True}])[1].startswith("options.args[1]: expected an integer")
    assert refusal([{"f32": 1e39}])[1].startswith("options.args[1]: 1e+39 is out of f32")
    client.ping()


def test_kernel_takes_1_to_4_tensors(client):
    """protocol.md: a kernel's inputs are 1 to 4 tensors.  python.md and kernel()'s
    docstring said nothing of it, and the client sent any number for the daemon to
    refuse.  Now none or more than 4 is refused before anything is sent (so before a
    staged operand's upload), in the daemon's own words and class."""
    x = np.zeros(4, np.float32)
    for n in (0, 5, 8):
        for call in (lambda: client.kernel("void main() {}", *([x] * n), lang="glsl",
                                           grid=1, device="cpu:0"),
                     lambda: client.submit("kernel", "void main() {}", *([x] * n),
                                           lang="glsl", grid=1, device="cpu:0").result()):
            with pytest.raises(dspk.InvalidArgument) as e:
                call()
            assert e.value.message == ("inputs: expected a non-empty array of at most 4 "
                                       "tensors, got an array of %d items" % n)
    # The same words as the daemon's own check of a task's inputs (no client check there)
    with pytest.raises(dspk.InvalidArgument) as d:
        client._call("task.run", {"op": "kernel", "inputs": [], "device": "cpu:0",
                                  "options": {"lang": "glsl", "source": "void main() {}",
                                              "grid": [1]}})
    assert d.value.message == ("inputs: expected a non-empty array of at most 4 tensors, "
                               "got an array of 0 items")
    assert "1 to 4" in dspk.Client.kernel.__doc__
    client.ping()


# ---- out= ----------------------------------------------------------------------------

def test_out_device_array_of_another_shape_or_dtype(client):
    """A DeviceArray out= that holds the result's bytes but not its shape or dtype was
    returned as a success (a new DeviceArray, not out); now InvalidArgument, as for a
    shared array (docs/python.md)."""
    x = f64(3, 4)
    for shape, dtype in (((4, 3), np.float64), ((12,), np.float64), ((5, 4), np.float64),
                         ((3, 8), np.float32), ((3, 2), np.complex128)):
        with client.empty(shape, dtype) as o:
            with pytest.raises(dspk.InvalidArgument, match=r"out=: the result is f64 \(3, 4\)"):
                client.map("scale", x, alpha=2.0, out=o)
    with client.empty((3, 4), np.float64) as o:  # the right one: it is returned
        assert client.map("scale", x, alpha=2.0, out=o) is o
        np.testing.assert_allclose(o.numpy(), 2 * x)
    with client.empty((2,), np.float64) as o:  # too small: ERANGE before any work
        with pytest.raises(dspk.RangeError):
            client.map("scale", x, out=o)


def test_out_shared_view_not_contiguous_or_read_only(client):
    """A strided view of a shared array was refused as "not a shared array of this
    connection"; a read-only view was written.  Both are refused, saying why, and
    nothing is written."""
    s = client.empty_shared((3, 4), np.float64)
    s[:] = 7.0
    with pytest.raises(dspk.InvalidArgument, match="not C-contiguous"):
        client.map("scale", np.ones(3), alpha=2.0, out=s[:, 1])
    ro = s.view()
    ro.flags.writeable = False
    with pytest.raises(dspk.InvalidArgument, match="read-only"):
        client.map("scale", np.ones((3, 4)), alpha=2.0, out=ro)
    assert (s == 7.0).all()
    r = client.map("scale", np.ones(4), alpha=2.0, out=s[1])  # a contiguous slice works
    assert r is s[1] or np.shares_memory(r, s)
    assert (s[1] == 2.0).all() and (s[0] == 7.0).all()


# ---- empty / empty_shared ------------------------------------------------------------

@pytest.mark.parametrize("make", ["empty", "empty_shared"])
def test_empty_shapes(client, make):
    f = getattr(client, make)
    with pytest.raises(dspk.InvalidArgument, match=r"shape: \(-1,\) has a negative"):
        f((-1,), np.float32)
    with pytest.raises(dspk.InvalidArgument, match=r"shape\[1\]: expected an integer"):
        f((2, 2.0), np.float32)
    with pytest.raises(dspk.InvalidArgument, match="shape: expected an integer"):
        f("3", np.float32)
    # msgpack's OverflowError (the size beyond 64 bits) or a wrapped int64 product.
    with pytest.raises(dspk.LimitExceeded, match="more than 2"):
        f((1 << 62,), np.float32)
    with pytest.raises(dspk.LimitExceeded):
        f((1 << 32, 1 << 32), np.float64)
    # A dimension of 2^63 or more: LimitExceeded (the daemon's rule), also beyond the
    # 64 bits msgpack carries (InvalidArgument "beyond 64 bits" before), never msgpack's
    # OverflowError; products that overflow 64 bits too.
    for shape in ((1 << 63,), (1 << 64,), (2, 1 << 70), np.array([1 << 63], np.uint64),
                  1 << 100, [(1 << 62), (1 << 62), 0], (1 << 40,) * 4):
        with pytest.raises(dspk.LimitExceeded) as e:
            f(shape, np.float32)
        assert e.value.code == -4 and e.value.name == "ELIMIT"
    assert not client._pending
    with pytest.raises(dspk.DtypeError):
        f(3, "no-such-dtype")
    assert f(np.int64(3), "float32").shape == (3,)
    client.ping()


# ---- connect -------------------------------------------------------------------------

def test_connect_arguments(daemon):
    for kw, msg in ((dict(name=5), "name: expected a str"),
                    (dict(timeout="5"), "timeout: expected a real number"),
                    (dict(timeout=True), "timeout: expected a real number"),
                    (dict(timeout=0), "timeout: 0.0 seconds"),
                    (dict(timeout=-1), "timeout: -1.0 seconds"),
                    (dict(timeout=math.nan), "timeout: nan seconds")):
        with pytest.raises(dspk.InvalidArgument) as e:
            dspk.connect(daemon.socket, **kw)
        assert e.value.message.startswith(msg), (kw, e.value.message)
    with pytest.raises(dspk.InvalidArgument, match="socket: expected a path"):
        dspk.connect(5)
    # A path object (was TypeError from socket.connect) and bytes are paths.
    for path in (pathlib.Path(daemon.socket), daemon.socket.encode()):
        with dspk.connect(path, timeout=TIMEOUT) as c:
            assert c.socket_path == daemon.socket
            c.ping()
    # A name longer than 63 bytes is cut there, at a character boundary.
    with dspk.connect(daemon.socket, name="é" * 40, timeout=TIMEOUT) as c:
        assert c.name == "é" * 31
        assert [x["name"] for x in c.status()["clients"] if x["id"] == c.client_id] \
            == ["é" * 31]


def test_shared_threshold_not_a_size(daemon, monkeypatch):
    """$DSPK_SHARED_THRESHOLD that is not a size is ignored (the default, 1 MiB), as
    libdspkclient ignores it; beyond 64 bits is not a size either (it was taken)."""
    for v, want in (("64K", 65536), ("0", 0), ("junk", 1 << 20), ("-5", 1 << 20),
                    ("1.5M", 1 << 20), (str(1 << 64), 1 << 20), ("16E", 1 << 20)):
        monkeypatch.setenv("DSPK_SHARED_THRESHOLD", v)
        with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
            assert c.shared_threshold == want, v


# ---- submit --------------------------------------------------------------------------

def test_submit_bad_call(client):
    """A bad call of submit() named the private method behind it (Client._op_gemm(),
    Client._run()); now the op, with Python's TypeError as for the method itself."""
    with pytest.raises(TypeError, match=r"submit\('gemm', \.\.\.\): missing .*'b'") as e:
        client.submit("gemm", A)
    assert "_op_" not in str(e.value)
    with pytest.raises(TypeError, match=r"submit\('fft', \.\.\.\): .*'bogus'") as e:
        client.submit("fft", A, bogus=1)
    assert "_run" not in str(e.value)
    with pytest.raises(dspk.InvalidArgument, match="progress: expected a callable"):
        client.submit("fft", A, progress=5)
    assert not client._pending
    np.testing.assert_allclose(client.submit("fft", A).result(TIMEOUT), np.fft.rfft(A))


# ---- bfloat16 helpers ----------------------------------------------------------------

def _bf16_exact(x):
    """bf16 bits of x by exact rational arithmetic: round to nearest, ties to even
    (normal numbers of bf16's range only)."""
    import math
    from fractions import Fraction
    m, e = math.frexp(abs(x))          # abs(x) = m * 2^e, 0.5 <= m < 1
    ulp = Fraction(2) ** (e - 1 - 7)   # 7 fraction bits below the leading one
    q = Fraction(abs(x)) / ulp
    n = math.floor(q)
    if q - n > Fraction(1, 2) or (q - n == Fraction(1, 2) and n % 2):
        n += 1
    v = float(n * ulp) * (1 if x > 0 else -1)
    return int(np.array(v, "<f4").view("<u4")) >> 16


def test_to_bfloat16_rounds_float64_once():
    rng = np.random.default_rng(5)
    xs = list(rng.standard_normal(2000) * 2.0 ** rng.integers(-60, 60, 2000))
    for k in range(1, 128):  # just above and below every tie of [1, 2)
        tie = 1 + (2 * k - 1) * 2 ** -8
        xs += [tie + 2 ** -30, tie - 2 ** -30, tie]
    xs += [-x for x in xs[-30:]]
    got = dspk.to_bfloat16(np.array(xs)).view("<u2")
    want = [_bf16_exact(x) for x in xs]
    bad = [(x, hex(g), hex(w)) for x, g, w in zip(xs, got.tolist(), want) if g != w]
    assert not bad, bad[:5]


def test_bfloat16_helpers_keep_shapes_and_refuse_non_reals():
    """to_bfloat16 of a scalar or 0-d array gave shape (1,) (np.ascontiguousarray makes
    0-d arrays 1-d), and from_bfloat16 too; complex lost its imaginary part with a
    warning, None became NaN; from_bfloat16 read float16 bits as bf16."""
    for x in (1.5, np.float64(-2.0), np.array(3.0), np.ones((0, 3)), np.arange(6.0)
              .reshape(2, 3)[:, ::2], np.asfortranarray(np.arange(6.0).reshape(2, 3)),
              np.arange(4), [1.0, 2.0]):
        b = dspk.to_bfloat16(x)
        want = np.asarray(x, np.float32)
        assert b.dtype == dspk.bfloat16 and b.shape == want.shape, (x, b.shape)
        back = dspk.from_bfloat16(b)
        assert back.dtype == np.float32 and back.shape == want.shape
        np.testing.assert_array_equal(back, want)  # these values are exact in bf16
    assert dspk.from_bfloat16(dspk.to_bfloat16(np.arange(6.0).reshape(2, 3)).T).tolist() \
        == [[0, 3], [1, 4], [2, 5]]
    # Round to nearest even: 1 + 2^-8 is halfway and goes to 1; 1 + 3*2^-8 up.
    assert dspk.from_bfloat16(dspk.to_bfloat16([1 + 2 ** -8, 1 + 3 * 2 ** -8])).tolist() \
        == [1.0, 1 + 2 ** -6]
    # float64 rounds once, to bf16: converted to float32 first, 1 + 2^-8 + 2^-30 became a
    # tie (1 + 2^-8) and went to 1.0 instead of up
    assert dspk.from_bfloat16(dspk.to_bfloat16(np.float64(1 + 2 ** -8 + 2 ** -30))) \
        == 1 + 2 ** -7
    for bad in (np.ones(2, np.complex64), None, "x", np.zeros(2, [("a", "<f4")])):
        with pytest.raises(dspk.DtypeError, match="to_bfloat16: dtype"):
            dspk.to_bfloat16(bad)
    with pytest.raises(dspk.InvalidArgument, match="to_bfloat16: not an array"):
        dspk.to_bfloat16([[1.0], [1.0, 2.0]])
    for bad in (np.ones(2, np.float16), np.ones(2, np.int16), np.ones(2, np.float32)):
        with pytest.raises(dspk.DtypeError, match="is not a bfloat16"):
            dspk.from_bfloat16(bad)


def test_bfloat16_operands_of_any_layout(client):
    """bf16 operands strided, Fortran-ordered or transposed go as bf16 (gemm, f32 out)."""
    a32, b32 = RNG.uniform(-1, 1, (4, 6)).astype(np.float32), np.ones((6, 2), np.float32)
    a, b = dspk.to_bfloat16(a32), dspk.to_bfloat16(b32)
    ra, rb = dspk.from_bfloat16(a).astype(np.float64), dspk.from_bfloat16(b)
    for x, y, want in ((a, np.asfortranarray(b), ra @ rb), (a[:, ::2], b[:3], ra[:, ::2] @ rb[:3]),
                       (a, a.T, ra @ ra.T)):
        r = client.gemm(x, y)
        assert r.dtype == np.float32
        np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)


# ---- cancel ----------------------------------------------------------------------------

def test_cancel_future_of_another_connection(daemon):
    """c2.cancel(a future of c1) sent task.cancel for c1's msgid on c2's connection, and
    canceled c2's own request of that number (msgids count from 1 on every
    connection).  Now InvalidArgument, as for a Future that is not submit()'s."""
    import concurrent.futures
    data = RNG.uniform(-1, 1, (600, 600))
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c1, \
            dspk.connect(daemon.socket, timeout=TIMEOUT) as c2:
        # Shared operands: small requests, each sent whole by submit() itself (a
        # large inline one may go on with the client's writer or worker thread, its
        # msgid 0 until then).
        b1, b2 = c1.empty_shared(data.shape, data.dtype), c2.empty_shared(data.shape,
                                                                           data.dtype)
        b1[:] = data
        b2[:] = data
        big = data
        f1 = [c1.submit("gemm", b1, b1) for _ in range(3)]
        f2 = [c2.submit("gemm", b2, b2) for _ in range(3)]
        assert [f.msgid for f in f1] == [f.msgid for f in f2]  # the same numbers
        for fut in (f1[-1], concurrent.futures.Future(), None):
            with pytest.raises(dspk.InvalidArgument, match="not a future of this"):
                c2.cancel(fut)
        for f in f1 + f2:  # nothing was canceled
            np.testing.assert_allclose(f.result(TIMEOUT), big @ big)


# ---- requests beyond max_message -----------------------------------------------------

def test_request_beyond_max_message_leaves_the_connection():
    """A request larger than max_message (a ping's data, a kernel's source: what the
    client cannot stage through buffers) was sent, and the daemon closed the
    connection on its header (every later call: Closed, 'Broken pipe').  Now
    LimitExceeded before sending; the connection stays."""
    from conftest import Daemon
    d = Daemon(["--max-message", "1M"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            with pytest.raises(dspk.LimitExceeded, match=r"ping: a request of \d+ bytes"):
                c.ping(b"x" * (2 << 20))
            with pytest.raises(dspk.LimitExceeded, match=r"task.run: a request of"):
                c.kernel("x" * (2 << 20), np.ones(3, np.float32), lang="glsl", grid=1,
                         device="cpu:0")
            assert not c._pending
            c.ping(b"x" * (1 << 19))
            # Operands are staged through buffers instead: the daemon's own answer.
            with pytest.raises(dspk.NotSupported):
                c.kernel("x", np.ones(300000), lang="glsl", grid=1, device="cpu:0")
            x = RNG.uniform(-1, 1, (400, 500))
            np.testing.assert_allclose(c.gemm(x, x.T), x @ x.T)
    finally:
        d.stop()


# ---- a daemon that stops reading -------------------------------------------------------

def test_timeout_bounds_sending_to_a_stopped_daemon(fresh_daemon, monkeypatch):
    """A daemon that stopped (SIGSTOP) reads nothing: a request larger than the socket's
    buffer blocked in sendmsg for ever, whatever the timeout (it bounded only the wait
    for the answer).  Now dspk.Timeout within the timeout; the request was cut, so the
    connection is closed and later calls raise dspk.Closed at once."""
    import signal
    import time
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")  # through the socket only
    c = dspk.connect(fresh_daemon.socket, timeout=1.0)
    x = np.ones((1024, 1024))  # 8 MiB: far more than a socket buffer holds
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(dspk.Timeout, match=r"^ETIMEDOUT: task.run reduce \(request \d+\) to "
                           r"dspkd at %s: could not send the request within 1s"
                           % re.escape(fresh_daemon.socket)):
            c.reduce(x)
        assert time.monotonic() - t0 < 10
        t0 = time.monotonic()
        with pytest.raises(dspk.Closed, match="cut after"):
            c.ping()
        with pytest.raises(dspk.Closed):
            c.submit("reduce", x).result(TIMEOUT)
        assert time.monotonic() - t0 < 1
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    c.close()
    with dspk.connect(fresh_daemon.socket, timeout=TIMEOUT) as c2:  # the daemon is fine
        assert c2.reduce(x) == x.size


def _submit_in_thread(c, *args, **kwargs):
    """c.submit(*args, **kwargs) on a thread of its own: (its future or exception,
    whether it returned within 10 s).  A submit() that blocks is not waited for."""
    import threading
    res = []

    def run():
        try:
            res.append(c.submit(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001
            res.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    return (res[0] if res else None), not t.is_alive()


@pytest.mark.parametrize("threshold", ["0", "1M"])
def test_submit_never_waits_for_a_daemon_that_reads_no_more(fresh_daemon, monkeypatch,
                                                            threshold):
    """submit() of a request larger than the socket's buffer waited, on the caller's
    thread, for the daemon to read it: for ever with timeout=None (probe 17 C3), though
    docs/python.md says it sends without waiting for any answer.  Now it returns at
    once, the rest of the request sent by the client's writer thread from a copy: the
    caller may write its array at once, and the daemon, once it reads again, computes
    on what was submitted."""
    import signal
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", threshold)  # 1M: no idle temporary yet
    c = dspk.connect(fresh_daemon.socket)  # timeout=None: waits for ever
    x = np.linspace(-1, 1, 1 << 20, dtype=np.float32)  # 4 MiB: more than the socket holds
    want = np.exp(x.astype(np.float64))
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        f, returned = _submit_in_thread(c, "map", "exp", x, device="cpu:0")
        assert returned, "submit() blocked on a daemon that reads no more"
        assert isinstance(f, dspk.TaskFuture), f
        assert not f.done() and not f.sent
        x[:] = 7.0  # the caller's array is its own again
        g, returned = _submit_in_thread(c, "reduce", np.ones(5), device="cpu:0")
        assert returned and isinstance(g, dspk.TaskFuture), g  # queued behind f
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    np.testing.assert_allclose(f.result(TIMEOUT), want, rtol=1e-6)
    assert f.sent
    assert g.result(TIMEOUT) == 5.0
    assert g.sent and g.msgid > f.msgid  # sent by the worker, after f's request
    assert c.ping() > 0
    c.close()


def test_submit_timeout_while_sending_ends_the_future(fresh_daemon, monkeypatch):
    """With timeout=2 such a submit() raised dspk.Timeout itself after 2 s and closed
    the connection (probe 17 C3).  Now submit() returns at once and the timeout ends
    the future: dspk.Timeout naming the request, the connection closed (part of the
    request went), every later call dspk.Closed."""
    import signal
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")
    c = dspk.connect(fresh_daemon.socket, timeout=1.0)
    x = np.ones((1024, 1024))  # 8 MiB
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        f, returned = _submit_in_thread(c, "reduce", x)
        assert returned and isinstance(f, dspk.TaskFuture), f
        e = f.exception(TIMEOUT)
        assert isinstance(e, dspk.Timeout), e
        assert re.match(r"^ETIMEDOUT: task.run reduce \(request \d+\) to dspkd at %s: could "
                        r"not send the request within 1s \(the daemon reads no more\); the "
                        r"connection is closed$" % re.escape(fresh_daemon.socket), str(e)), e
        with pytest.raises(dspk.Closed, match="cut after"):
            c.ping()
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    c.close()
    with dspk.connect(fresh_daemon.socket, timeout=TIMEOUT) as c2:  # the daemon is fine
        assert c2.reduce(x) == x.size


def test_close_ends_a_submit_still_being_sent(fresh_daemon, monkeypatch):
    """close() while the writer thread waits for room for a submit()'s request
    (timeout=None): close() returns at once and the future ends with dspk.Closed."""
    import signal
    import threading
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")
    c = dspk.connect(fresh_daemon.socket)
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        f, returned = _submit_in_thread(c, "map", "exp", np.ones(1 << 20), device="cpu:0")
        assert returned and isinstance(f, dspk.TaskFuture), f
        closer = threading.Thread(target=c.close, daemon=True)
        closer.start()
        closer.join(10)
        assert not closer.is_alive(), "close() is blocked"
        assert isinstance(f.exception(TIMEOUT), dspk.Closed)
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    with dspk.connect(fresh_daemon.socket, timeout=TIMEOUT) as c2:
        assert c2.reduce(np.ones(3)) == 3


def test_a_timeout_names_the_call_and_the_socket(fresh_daemon):
    """dspk.Timeout said only "no answer to request 4 within 1s": neither the call nor
    the socket, and from connect() not that it was connecting (probe 16 C, defect 3).
    Now each names the request's method (a task.run its op) and id, and the daemon's
    socket; connect()'s says it is connect()'s."""
    import signal
    sock = re.escape(fresh_daemon.socket)
    c = dspk.connect(fresh_daemon.socket, timeout=1.0)
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        for call, what in [(c.ping, "ping"), (c.status, "status"),
                           (lambda: c.empty(4), "buffer.create"),
                           (lambda: c.reduce(np.ones(4)), "task.run reduce")]:
            with pytest.raises(dspk.Timeout, match=r"^ETIMEDOUT: %s \(request \d+\) to "
                               r"dspkd at %s: no answer within 1s$" % (re.escape(what), sock)):
                call()
        with pytest.raises(dspk.Timeout, match=r"^ETIMEDOUT: connect\(\): hello \(request 1\) "
                           r"to dspkd at %s: no answer within 0.5s$" % sock):
            dspk.connect(fresh_daemon.socket, timeout=0.5)
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    assert c.ping() > 0
    c.close()


def test_timeout_bounds_connecting(tmp_path):
    """A socket whose listener accepts no more (its backlog full) blocked connect()
    for ever; with a timeout it raises dspk.Timeout."""
    import socket
    import time
    path = str(tmp_path / "full.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(0)
    fill = []
    try:
        while True:  # fill the backlog with connections nobody accepts
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            fill.append(s)
            try:
                s.connect(path)
            except BlockingIOError:
                break
            assert len(fill) < 100
        t0 = time.monotonic()
        with pytest.raises(dspk.Timeout, match="cannot connect to dspkd at .* within 0.5s"):
            dspk.connect(path, timeout=0.5)
        assert time.monotonic() - t0 < 5
    finally:
        for s in fill:
            s.close()
        srv.close()


def test_ping_and_devices_arguments(client):
    """ping(5) raised a bare TypeError (len() of an int), ping("abc") memoryview's, a
    strided array's data memoryview's cast error; devices(all="no") listed every
    backend."""
    for bad in (5, "abc", None, object()):
        with pytest.raises(dspk.InvalidArgument, match="data: expected a bytes-like"):
            client.ping(bad)
    # A buffer of Python objects: its bytes are this process's addresses (probe 23 C3:
    # they were sent and echoed), refused before anything is sent, as an op's operand
    # of dtype object is.
    for bad in (np.array([object(), object()]), np.array([1, "a"], dtype=object),
                memoryview(np.array([object()])),
                np.zeros(2, dtype=[("Oa", "<f4"), ("b", object)])):
        with pytest.raises(dspk.DtypeError, match="data: a buffer of Python objects"):
            client.ping(bad)
        with pytest.raises(dspk.DtypeError, match="source: a buffer of Python objects"):
            client.kernel(memoryview(bad), np.zeros(4, np.float32), lang="glsl", grid=1)
    # a field named with an "O" is no object
    assert client.ping(np.zeros(2, dtype=[("Oa", "<f4")])) >= 0
    for data in (b"", b"abc", bytearray(300000), np.arange(8.0)[::2], np.ones((3, 3))):
        assert client.ping(data) >= 0  # echoed and checked
    with pytest.raises(dspk.InvalidArgument, match="all: expected a bool"):
        client.devices(all="no")
    assert len(client.devices(all=np.bool_(False))) == len(client.devices())


def _bf16_of_fraction(v):
    """bf16 bits of the exact rational v (a Fraction), rounded to nearest even by
    integer arithmetic alone (normal numbers of bf16's range only): independent of
    numpy and of floats."""
    from fractions import Fraction
    v = Fraction(v)
    sign = 0x8000 if v < 0 else 0
    v = abs(v)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    q = v / Fraction(2) ** (e - 7)      # in [128, 256)
    n = q.numerator // q.denominator
    r = q - n
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2):
        n += 1
    if n == 256:
        n, e = 128, e + 1
    return sign | ((e + 127) << 7) | (n - 128)


def test_to_bfloat16_keeps_negative_zero_and_converts_bools():
    """-0.0 among other elements of a list (converted one by one from its exact value,
    0/1) became +0.0, and bool arrays were refused with DtypeError.  Now -0.0 keeps its
    sign on every path and arrays of bools convert as numpy converts them (True 1.0)."""
    from fractions import Fraction
    for x in ([-0.0, 1], [-0.0, 2 ** 70], [np.longdouble(-0.0), 1.0],
              np.array([-0.0, Fraction(1, 2)], object), np.array([-0.0, 1.0], np.float16),
              np.array([-0.0, 1.0], np.float32), np.array([-0.0, 1.0]),
              np.array([-0.0, 1.0], np.longdouble)):
        bits = dspk.to_bfloat16(x).view("<u2")
        assert bits[0] == 0x8000, (x, hex(bits[0]))
    assert dspk.to_bfloat16(-0.0).view("<u2") == 0x8000
    for x, want in ((np.array([True, False, True]), [1.0, 0.0, 1.0]),
                    (np.bool_(True), 1.0), ([True, False], [1.0, 0.0]),
                    (np.array([[False], [True]]), [[0.0], [1.0]])):
        b = dspk.to_bfloat16(x)
        assert b.dtype == dspk.bfloat16 and b.shape == np.shape(want)
        assert dspk.from_bfloat16(b).tolist() == want


def test_to_bfloat16_rounds_once_from_the_exact_value_of_every_type():
    """Inputs wider than float64 were rounded to float64 first: a value just above a
    bf16 tie landed on it and went to even.  int64/uint64/Python int 2**62 + 2**54 + 1
    gave 4.611686018427388e18 (want 4.647714815446352e18), np.longdouble(1 + 2**-8 +
    2**-60) gave 1.0 (want 1.0078125).  Checked against exact rational rounding."""
    from fractions import Fraction
    rng = np.random.default_rng(21)
    ints = [2 ** 62 + 2 ** 54 + 1, 2 ** 62 + 2 ** 54, 2 ** 62 + 2 ** 54 - 1, 2 ** 63 - 1,
            2 ** 53 + 1, 2 ** 55 + 2 ** 47 + 1, 3 * 2 ** 60 + 2 ** 52 + 2 ** 9]
    for _ in range(300):  # near a tie at every width of 54 to 63 bits
        e = int(rng.integers(54, 63))
        tie = (int(rng.integers(128, 256)) * 2 + 1) << (e - 8)
        ints += [tie + int(rng.integers(1, 1 << (e - 53))), tie - 1, tie,
                 int(rng.integers(1 << 53, 1 << 62))]
    cases = [(np.array(ints, np.int64), ints),
             (np.array([-i for i in ints], np.int64), [-i for i in ints]),
             (np.array(ints + [2 ** 64 - 1, 2 ** 63 + 2 ** 55 + 1], np.uint64),
              ints + [2 ** 64 - 1, 2 ** 63 + 2 ** 55 + 1]),
             (list(ints), ints),                    # Python ints: numpy's int64
             (np.int64(-(2 ** 62 + 2 ** 54 + 1)), [-(2 ** 62 + 2 ** 54 + 1)])]
    big = [2 ** 70 + 2 ** 62 + 1, -(2 ** 100 + 2 ** 92 + 3), 2 ** 64 + 2 ** 56 + 1]
    cases.append((big, big))                        # beyond 64 bits: an object array
    fr = [Fraction(1, 3), Fraction(-257, 256 * 256) + Fraction(1, 10 ** 30)]
    cases.append((np.array(fr, object), fr))
    if np.finfo(np.longdouble).nmant > 52:          # x86's 80-bit long double
        one = np.longdouble(1)
        lds = [(one + one / 256 + one / 2 ** 60, 1 + Fraction(1, 256) + Fraction(1, 2 ** 60)),
               (one + one / 256 - one / 2 ** 60, 1 + Fraction(1, 256) - Fraction(1, 2 ** 60)),
               (one + 3 * one / 256 + one / 2 ** 62,
                1 + Fraction(3, 256) + Fraction(1, 2 ** 62))]
        for k in range(1, 128, 7):
            tie = 1 + Fraction(2 * k - 1, 256)
            for off in (Fraction(1, 2 ** 58), -Fraction(1, 2 ** 58), 0):
                v = tie + off
                lds.append((np.longdouble(v.numerator) / np.longdouble(v.denominator), v))
        cases.append((np.array([a for a, _ in lds]), [v for _, v in lds]))
        cases.append((-np.array([a for a, _ in lds]), [-v for _, v in lds]))
    f64 = [1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -8, -(3 + 2 ** -6 + 2 ** -52)]
    cases += [(np.array(f64), [Fraction(x) for x in f64]),
              (np.array(f64, np.float32), [Fraction(float(x)) for x in
                                           np.array(f64, np.float32)]),
              (np.array([1 + 2 ** -8 + 2 ** -10], np.float16),
               [Fraction(1 + 2 ** -8 + 2 ** -10)])]
    for x, exact in cases:
        got = dspk.to_bfloat16(x).view("<u2").reshape(-1).tolist()
        want = [_bf16_of_fraction(Fraction(v)) for v in exact]
        bad = [(v, hex(g), hex(w)) for v, g, w in zip(exact, got, want) if g != w]
        assert not bad, (type(x).__name__, getattr(x, "dtype", None), bad[:4])
    # the outside tester's cases
    for x in (np.array([2 ** 62 + 2 ** 54 + 1], np.int64),
              np.array([2 ** 62 + 2 ** 54 + 1], np.uint64), [2 ** 62 + 2 ** 54 + 1]):
        assert dspk.from_bfloat16(dspk.to_bfloat16(x))[0] == 4.647714815446352e18
    for bad in ([True, 2 ** 70], [None, 2 ** 70], ["1", 2 ** 70], [1j, 2 ** 70]):
        with pytest.raises(dspk.DtypeError, match="to_bfloat16: dtype"):
            dspk.to_bfloat16(np.array(bad, object))



def test_to_bfloat16_of_a_mixed_list_rounds_each_element_once():
    """A list mixing Python ints with floats (or numpy floats of another width) went
    through numpy.asarray's float64 promotion: 2**62 + 2**54 + 1 was rounded to float64
    (4.611686018427388e18... a tie) and then to bf16, 0x5e80 instead of 0x5e81.  Each
    element now converts from its own exact value."""
    from fractions import Fraction
    n = 2 ** 62 + 2 ** 54 + 1
    for x, exact in (([n, 1.0], [n, 1]), ((n, 1.5), [n, Fraction(3, 2)]),
                     ([np.float16(1), n], [1, n]), ([[n, 2.0], [0.5, -n]],
                                                   [n, 2, Fraction(1, 2), -n]),
                     ([np.uint64(2 ** 63 + 2 ** 55 + 1), -1],
                      [2 ** 63 + 2 ** 55 + 1, -1]),
                     ([np.array([n]), np.array([0.25])], [n, Fraction(1, 4)])):
        got = dspk.to_bfloat16(x).view("<u2").reshape(-1).tolist()
        assert got == [_bf16_of_fraction(Fraction(v)) for v in exact], (x, got)
        assert dspk.to_bfloat16(x).shape == np.asarray(x).shape
    assert dspk.to_bfloat16([n, 1.0]).view("<u2")[0] == 0x5e81
    # plain float lists keep numpy's fast path and values
    assert dspk.to_bfloat16([1.0, 2.5]).view("<u2").tolist() == [0x3f80, 0x4020]
    # a bool among floats is no real number (numpy made it 1.0)
    with pytest.raises(dspk.DtypeError, match="to_bfloat16: dtype object holding a bool"):
        dspk.to_bfloat16([True, 1.5])
    with pytest.raises(dspk.InvalidArgument):  # ragged: still not an array
        dspk.to_bfloat16([[1.0], [1.0, 2**62]])
    # a negative zero keeps its sign among other numbers (it became +0)
    from fractions import Fraction as F
    for x, at in (([-0.0, 1], 0), ([F(0), -0.0], 1), ([np.float16(-0.0), 2 ** 70], 0),
                  ((2 ** 62 + 1, -0.0), 1)):
        got = dspk.to_bfloat16(x).view("<u2").tolist()
        assert got[at] == 0x8000 and got[1 - at] != 0x8000, (x, got)


def test_to_bfloat16_of_a_list_holding_0d_arrays():
    """numpy.asarray takes a 0-d array in a list as its value ([np.array(1.0), 2.0] is
    [1., 2.], and an op takes it so); to_bfloat16 refused it, "dtype object holding a
    ndarray" (probe 18 C3).  Each converts from its exact value, under a scalar's rules
    (a 0-d bool among numbers, a complex, are refused as the scalars are)."""
    from fractions import Fraction
    n = 2 ** 62 + 2 ** 54 + 1
    for x, exact in (([np.array(1.0), 2.0], [1, 2]),
                     ([np.array(1.0, np.float32)], [1]),
                     ([np.array(n), 1.0], [n, 1]),               # int64, exactly
                     ([np.array(np.longdouble(1) / 3), np.float16(0.5)],
                      [Fraction(*(np.longdouble(1) / 3).as_integer_ratio()),
                       Fraction(1, 2)]),
                     ([[np.array(0.25), 3], [np.array(-0.5), np.array(2 ** 70, object)]],
                      [Fraction(1, 4), 3, Fraction(-1, 2), 2 ** 70])):
        got = dspk.to_bfloat16(x)
        assert got.shape == np.asarray(x).shape
        assert got.view("<u2").reshape(-1).tolist() == \
            [_bf16_of_fraction(Fraction(v)) for v in exact], (x, got)
    assert dspk.to_bfloat16([1.0, np.array(-0.0)]).view("<u2").tolist()[1] == 0x8000
    with pytest.raises(dspk.DtypeError, match="holding a bool"):
        dspk.to_bfloat16([np.array(True), 1.5])
    with pytest.raises(dspk.DtypeError):
        dspk.to_bfloat16([np.array(1j), 1.5])

# ---- $DSPK_SHARED_THRESHOLD: sizes exactly as proto/units.c reads them ---------------

def _units_table():
    """(value, size or None) of every ok()/bad() case of tests/proto/test_units.c, the
    C parser's own test (tests/common's sibling), with C's escapes decoded to the bytes
    the environment would hold; None where the repository is not at hand."""
    import codecs
    import re
    common = os.environ.get("DSPK_TESTS_COMMON") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "common")
    path = os.path.join(common, "..", "proto", "test_units.c")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read()
    cases = []
    for kind, lit, expr in re.findall(r'\b(ok|bad)\("((?:[^"\\]|\\.)*)"(?:,\s*([^;]+))?\);',
                                      text):
        raw = codecs.escape_decode(lit.encode("latin-1"))[0]
        want = None
        if kind == "ok":
            expr = expr.strip().rstrip(")").strip() if expr.count(")") > expr.count("(") \
                else expr.strip()
            want = eval(expr.replace("(uint64_t)", "").replace("UINT64_MAX", str(2 ** 64 - 1)),
                        {"__builtins__": {}})
        cases.append((os.fsdecode(raw), want))
    return cases


# The table of proto/units.c's test, for a copy of python/ run without the repository.
UNITS_TABLE = [("0", 0), ("4096", 4096), ("007", 7), ("18446744073709551615", 2 ** 64 - 1),
               ("1K", 1024), ("1KiB", 1024), ("2M", 2 << 20), ("2MiB", 2 << 20),
               ("3G", 3 << 30), ("3GiB", 3 << 30), ("5TiB", 5 << 40), ("1T", 1 << 40),
               ("16777215T", 16777215 << 40), ("16777216T", None),
               ("18014398509481984K", None), ("18446744073709551616", None),
               ("", None), ("M", None), ("-1", None), ("+1", None), (" 1", None),
               ("1 ", None), ("1 M", None), ("1.5M", None), ("1k", None), ("1m", None),
               ("1MB", None), ("1B", None), ("0x10", None), (" 5", None), ("5\n", None),
               ("\t7", None), ("2m", None), ("2kib", None), ("3g", None), ("\u0663", None),
               ("1\uff10", None), ("\u00b2", None)]


def test_shared_threshold_is_read_as_proto_units_c_reads_sizes(monkeypatch):
    """Python stripped spaces and took units in any case (" 5", "5\\n", "2m", "2kib",
    "3g" accepted) where libdspkclient (proto/units.c) ignores all of them.  Each case
    of the C parser's own test (its table read from tests/proto/test_units.c, and a
    copy of it here): a size it accepts is the threshold, one it refuses leaves the
    default (1 MiB)."""
    from dspk import _client
    table = _units_table()
    cases = list(UNITS_TABLE) + (table or [])
    if table is not None:
        assert len(table) > 40 and (" 5", None) in table and ("64KiB", 65536) in table
    for value, want in cases:
        monkeypatch.setenv("DSPK_SHARED_THRESHOLD", value)
        got = _client._env_threshold()
        assert got == (want if want is not None else 1 << 20), (value, got, want)
    monkeypatch.delenv("DSPK_SHARED_THRESHOLD")
    assert _client._env_threshold() == 1 << 20


def test_shared_threshold_of_the_environment_at_connect(daemon, monkeypatch):
    for value, want in (("2kib", 1 << 20), (" 5", 1 << 20), ("2KiB", 2048), ("0", 0)):
        monkeypatch.setenv("DSPK_SHARED_THRESHOLD", value)
        with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
            assert c.shared_threshold == want, value


def test_a_path_object_giving_no_path_is_invalid_argument(daemon):
    """An os.PathLike whose __fspath__ gives neither str nor bytes escaped as a plain
    TypeError, one whose __fspath__ raises as that exception: a socket of another
    type, python.md says, is dspk.InvalidArgument naming it, before connecting."""
    class Gives:
        def __init__(self, v):
            self.v = v

        def __fspath__(self):
            return self.v

    class Raises:
        def __init__(self, e):
            self.e = e

        def __fspath__(self):
            raise self.e

    class BadRepr(Gives):
        def __repr__(self):
            raise RuntimeError("no repr")

    for obj, named in ((Gives(3), "Gives"), (Gives(None), "Gives"),
                       (Gives(pathlib.Path("/x")), "Gives"),
                       (Raises(ValueError("no path")), "Raises"),
                       (Raises(TypeError("odd")), "Raises"),
                       (Raises(OSError(5, "io")), "Raises"), (BadRepr(2.5), "BadRepr")):
        with pytest.raises(dspk.InvalidArgument) as e:
            dspk.connect(obj)
        assert e.value.message.startswith("socket: expected a path, got " + named), \
            e.value.message
        assert "__fspath__" in e.value.message
    # one that gives a path is one
    with dspk.connect(Gives(daemon.socket), timeout=TIMEOUT) as c:
        assert c.socket_path == daemon.socket and c.ping() > 0
    with dspk.connect(Gives(daemon.socket.encode()), timeout=TIMEOUT) as c:
        assert c.socket_path == daemon.socket


# ---- a DeviceArray where a numpy array is wanted -------------------------------------

def test_a_device_array_is_not_taken_for_a_numpy_array(client):
    """to_device(DeviceArray) raised a misleading 'DtypeError: dtype object',
    numpy.asarray(DeviceArray) gave an object array, pickle.dumps(DeviceArray) said
    "cannot pickle 'socket' object".  Now each says what a DeviceArray is and what to
    use instead (.numpy())."""
    import copy
    import pickle
    d = client.to_device(np.arange(4.0))
    try:
        with pytest.raises(dspk.InvalidArgument, match=r"array: a DeviceArray .*\.numpy\(\)"):
            client.to_device(d)
        for convert in (np.asarray, np.array, lambda x: np.asarray([x])):
            with pytest.raises(TypeError, match=r"DeviceArray is not a numpy array.*"
                                                r"\.numpy\(\)"):
                convert(d)
        # numpy's ufuncs and operators: TypeError (__array_ufunc__ = None), never an
        # object array holding the DeviceArray (np.ones(3, object) + d made one)
        x = np.ones(4)
        for op in (lambda: np.add(x, d), lambda: np.add(d, 1), lambda: x + d,
                   lambda: d + x, lambda: d * 2, lambda: 2.0 * d, lambda: x @ d,
                   lambda: np.ones(4, object) + d, lambda: np.sin(d), lambda: -d,
                   lambda: np.float64(1) + d, lambda: np.multiply(x, d, dtype=object)):
            with pytest.raises(TypeError, match="DeviceArray"):
                op()
        assert dspk.DeviceArray.__array_ufunc__ is None
        for dump in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="cannot pickle or copy a dspk.DeviceArray"):
                dump(d)
        with pytest.raises(TypeError, match="cannot pickle or copy a dspk.Client"):
            pickle.dumps(client)
        with pytest.raises(dspk.InvalidArgument, match="DeviceArray is not a numpy array"):
            dspk.to_bfloat16(d)
        # what it says to use works, and the DeviceArray is an operand as before
        np.testing.assert_array_equal(d.numpy(), np.arange(4.0))
        assert pickle.loads(pickle.dumps(d.numpy())).tolist() == [0, 1, 2, 3]
        assert client.reduce(d) == 6
        e = client.to_device(d.numpy())
        np.testing.assert_array_equal(e.numpy(), np.arange(4.0))
        e.free()
    finally:
        d.free()


# ---- messages that name the thing at fault ----------------------------------------

def test_out_too_small_names_the_result_dtype(client):
    """f16 gemm makes f32: out= an f16 array of the same shape is too small, and the
    message says the result is f32 (the shapes alone look equal)."""
    a = np.ones((2, 2), np.float16)
    out = client.empty((2, 2), np.float16)
    with pytest.raises(dspk.RangeError, match=r"the result \(f32 \(2, 2\), 16 bytes\) does "
                                              r"not fit the 8 bytes of out= \(f16 "
                                              r"\(2, 2\)\)"):
        client.gemm(a, a, out=out)


@pytest.mark.parametrize("path", ["", b""])
def test_connect_to_an_empty_path_says_it_is_empty(path):
    with pytest.raises(dspk.ConnectError, match="the socket path is empty"):
        dspk.connect(path, timeout=TIMEOUT)


def test_a_freed_device_array_says_it_was_freed(client):
    d = client.to_device(np.ones(4, np.float32))
    assert "freed" not in repr(d)
    d.free()
    assert repr(d).endswith(", freed)")
    for call, what in [(d.numpy, "numpy()"),
                       (lambda: client.map("abs", d), "input 0"),
                       (lambda: client.map("abs", np.ones(4, np.float32), out=d), "out=")]:
        with pytest.raises(dspk.NoBuffer, match=r"^ENOBUF: %s: this DeviceArray was freed "
                                                r"\(buffer %d" % (re.escape(what), d.buffer)):
            call()
    assert client.ping() >= 0


def test_a_shared_array_of_another_client_as_out_says_so(daemon, client):
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as other:
        out = other.empty_shared(4)
        with pytest.raises(dspk.InvalidArgument, match="out=: a shared array of another "
                                                       "Client"):
            client.map("abs", np.ones(4, np.float32), out=out)
        with pytest.raises(dspk.InvalidArgument, match="of this connection"):
            client.map("abs", np.ones(4, np.float32), out=np.empty(4, np.float32))


# ---- type hints (py.typed): as wide as what runs --------------------------------------

def test_type_hints_are_those_of_the_runtime():
    """A bytes path object connects and ping() takes any bytes-like object, so the
    hints say so; an op returns a numpy array, or out= (a DeviceArray or a shared
    array) when given: its overloads say which, not Any."""
    hints = typing.get_type_hints
    assert os.PathLike[bytes] in typing.get_args(hints(dspk.connect)["socket"])
    assert os.PathLike[bytes] in typing.get_args(hints(dspk.Client.__init__)["socket"])
    assert {bytes, bytearray, memoryview} <= \
        set(typing.get_args(hints(dspk.Client.ping)["data"]))
    for op in ("gemm", "fft", "fir", "contract", "reduce", "map"):
        fn = getattr(dspk.Client, op)
        assert set(typing.get_args(hints(fn)["return"])) == {np.ndarray, dspk.DeviceArray}, op
        plain, given = (hints(o) for o in typing.get_overloads(fn))
        assert plain["out"] is type(None) and plain["return"] is np.ndarray, op
        assert given["out"] is given["return"], op
        assert {getattr(t, "__forward_arg__", t) for t in given["out"].__constraints__} \
            == {np.ndarray, "DeviceArray"}, op
    assert os.path.exists(os.path.join(os.path.dirname(dspk.__file__), "py.typed"))


def _fits(value, hint):
    """Whether ``value`` is of the type ``hint`` (what typing.get_type_hints gives: a
    class, Any, a Union, a TypeVar, Iterable[...] or Sequence[...], a Callable)."""
    import collections.abc
    if hint is typing.Any:
        return True
    if hint is type(None):
        return value is None
    if isinstance(hint, typing.TypeVar):
        return any(_fits(value, c) for c in hint.__constraints__) if hint.__constraints__ \
            else True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(_fits(value, a) for a in args)
    if origin in (collections.abc.Iterable, collections.abc.Sequence):
        return isinstance(value, origin) and all(_fits(x, args[0]) for x in value)
    if origin in (collections.abc.Mapping, dict):
        return isinstance(value, origin)
    if origin is collections.abc.Callable:
        return callable(value)
    if origin is not None:
        return isinstance(value, origin)
    if isinstance(hint, typing.ForwardRef):
        hint = getattr(dspk, hint.__forward_arg__)
    if hint is float:  # PEP 484's numeric tower: an int is taken for a float
        return isinstance(value, (int, float))
    return isinstance(value, hint)


def test_the_hints_take_what_the_calls_take(daemon, client):
    """alpha/beta were hinted float (refusing numpy.float32, Fraction, longdouble: the
    calls take any numbers.Real), timeouts Optional[float], trans_a/inverse bool (numpy
    bools, 0 and 1 work), axes and shape int or Sequence[int] (a numpy integer or 1-D
    array works), ping's data bytes, bytearray or memoryview (a numpy array works)
    (probe 16 C, defect 2).  Each value here is taken by the call, which runs it, and
    fits the hint of its parameter, in the implementation's signature and in every
    overload's; and every parameter of every public function has a hint."""
    import array
    import fractions as fr
    reals = [2, 2.0, np.float32(2), np.float16(2), np.longdouble(2), fr.Fraction(2),
             np.int64(2), np.uint8(2)]
    flags = [True, False, np.True_, np.False_, 0, 1, np.int8(1)]
    a = np.ones((2, 2), np.float32)
    cases = []  # (function, parameter, value, the call with it)
    for v in reals:
        cases.append((dspk.Client.gemm, "alpha", v, lambda v=v: client.gemm(a, a, alpha=v)))
        cases.append((dspk.Client.gemm, "beta", v, lambda v=v: client.gemm(a, a, a, beta=v)))
        cases.append((dspk.Client.map, "alpha", v,
                      lambda v=v: client.map("scale", a, alpha=v)))
        cases.append((dspk.TaskFuture.result, "timeout", v,
                      lambda v=v: client.submit("reduce", a).result(v)))
        cases.append((dspk.TaskFuture.exception, "timeout", v,
                      lambda v=v: client.submit("reduce", a).exception(v)))
        cases.append((dspk.connect, "timeout", v,
                      lambda v=v: dspk.connect(daemon.socket, timeout=v).close()))
    for v in flags:
        cases.append((dspk.Client.gemm, "trans_a", v, lambda v=v: client.gemm(a, a, trans_a=v)))
        cases.append((dspk.Client.gemm, "trans_b", v, lambda v=v: client.gemm(a, a, trans_b=v)))
        cases.append((dspk.Client.fft, "inverse", v,
                      lambda v=v: client.fft(np.ones(4, np.complex64), inverse=v)))
        cases.append((dspk.Client.devices, "all", v, lambda v=v: client.devices(all=v)))
    for v in [0, np.int64(1), [0, 1], (np.int32(0),), np.array([0, 1]), range(2)]:
        cases.append((dspk.Client.reduce, "axes", v, lambda v=v: client.reduce(a, "sum", v)))
    for v in [3, np.int64(3), [2, 3], (2, np.uint16(3)), np.array([2, 3]), range(1, 3)]:
        cases.append((dspk.Client.empty, "shape", v, lambda v=v: client.empty(v).free()))
        cases.append((dspk.Client.empty_shared, "shape", v, lambda v=v: client.empty_shared(v)))
    for v in [b"ab", bytearray(b"ab"), memoryview(b"ab"), np.arange(3, dtype=np.uint8),
              array.array("i", [1, 2]), np.float64(1.5)]:
        cases.append((dspk.Client.ping, "data", v, lambda v=v: client.ping(v)))
    for v in [1, np.int64(1 << 20)]:
        def setting(v=v):
            old = client.shared_threshold
            client.shared_threshold = v
            client.shared_threshold = old
        cases.append((dspk.Client.shared_threshold.fset, "value", v, setting))
    for v in reals[:6]:
        def timing(v=v):
            old = client.timeout
            client.timeout = v
            client.timeout = old
        cases.append((dspk.Client.timeout.fset, "value", v, timing))
    for fn, name, v, call in cases:
        call()  # taken
        hints = [typing.get_type_hints(fn)]
        hints += [typing.get_type_hints(o) for o in typing.get_overloads(fn)]
        for h in hints:
            assert _fits(v, h[name]), (fn.__qualname__, name, v, h[name])
    # Every public parameter hinted (the hint resolves: no undefined name).
    public = [dspk.connect, dspk.default_socket]
    for cls in (dspk.Client, dspk.TaskFuture, dspk.DeviceArray):
        for attr, obj in vars(cls).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            if isinstance(obj, property):
                public += [f for f in (obj.fget, obj.fset) if f is not None]
            elif callable(obj):
                public.append(obj)
    for fn in public:
        hints = typing.get_type_hints(fn)
        for p in list(inspect.signature(fn).parameters.values())[1:] if \
                "." in fn.__qualname__ else inspect.signature(fn).parameters.values():
            assert p.name in hints, (fn.__qualname__, p.name)


def test_bfloat16_is_named_as_such_in_reprs_and_messages(client):
    """A bf16 DeviceArray's repr says dspk.bfloat16 and an out= message bf16, never
    numpy's structured [('bf16', '<u2')] (probe 20 C4a)."""
    b = dspk.to_bfloat16(np.ones((2, 2), np.float32))
    d = client.to_device(b, device="cpu:0")
    try:
        assert repr(d) == "DeviceArray(buffer=%d, device='cpu:0', shape=(2, 2), " \
            "dtype=dspk.bfloat16)" % d.buffer
        a = np.ones((2, 2), np.float32)
        with pytest.raises(dspk.RangeError) as e:
            client.gemm(a, a, out=d)
        assert e.value.message.endswith("does not fit the 8 bytes of out= (bf16 (2, 2))"), \
            e.value.message
        s = client.empty_shared((2, 2), dspk.bfloat16, device="cpu:0")
        with pytest.raises(dspk.RangeError) as e:
            client.gemm(a, a, out=s)
        assert e.value.message.endswith("out= (bf16 (2, 2))"), e.value.message
        f = client.empty_shared((2, 4), np.float16, device="cpu:0")
        with pytest.raises(dspk.InvalidArgument) as e:
            client.gemm(a, a, out=f)
        assert e.value.message == "out=: the result is f32 (2, 2), out= is f16 (2, 4)", \
            e.value.message
    finally:
        d.free()
