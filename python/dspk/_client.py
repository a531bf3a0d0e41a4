"""The connection to dspkd: framing, request matching, ops, device buffers.

One socket per Client.  Requests are written under a send lock.  Responses are read by
whichever thread needs one (a lock-protected pump: the first waiting thread reads and files
every response by msgid, the others wait for theirs), so a synchronous call costs no thread
switch; while futures of :meth:`Client.submit` are pending, a reader thread keeps reading so
that their callbacks run and ``concurrent.futures.wait`` works without anyone pumping.  A
submit() whose task needs an answer before it can be sent (a staged operand's or a large
result's temporary buffer), or made while another thread sends, is done by a worker
thread of the client's, in order, and the rest of a submit()'s request that the socket
does not take at once is written by a writer thread that holds the send lock until the
request is whole, so that submit() itself never waits for an answer nor for the socket.
Callbacks (done-callbacks, progress) run on the dspk-callbacks thread.
"""
from __future__ import annotations

import _thread
import array as _array
import collections
import concurrent.futures
import copy
import decimal
import concurrent.futures._base as _cf
import errno
import fcntl
import fractions
import functools
import inspect
import io
import logging
import math
import mmap
import numbers
import operator
import os
import re
import select
import socket as _socket
import stat as _stat
import sys
import threading
import time
import types
import weakref
# The C module's socketpair(): its sockets own their descriptors from the start
# (socket.socketpair() moves them into new objects, a window where they are bare ints).
from _socket import socketpair as _socketpair
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, NamedTuple,
                    Optional, Sequence, Set, Tuple, TypeVar, Union, cast, overload)

import msgpack
import numpy as np

from . import _errors
from . import _dtypes
from ._dtypes import as_ndarray, from_signal_handler, numpy_dtype, user_code, wire_name
from ._errors import Error

_LOGGER = logging.getLogger("concurrent.futures")

__all__ = ["connect", "default_socket", "Client", "DeviceArray", "TaskFuture"]

ArrayLike = Any  # numpy.ndarray, DeviceArray, or anything numpy.asarray accepts
Progress = Callable[[str, float], None]
OutArg = Union["DeviceArray", np.ndarray]  # a DeviceArray, or a shared array (empty_shared)
# An op's out=, which it returns: a DeviceArray, or a shared array (empty_shared).
_Out = TypeVar("_Out", "DeviceArray", np.ndarray)
# A socket path: str, bytes, or a path object giving either.
SocketPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
# ping()'s data: a bytes-like object.  Python 3.11's typing has no type for "any
# object of the buffer protocol": these are the common ones (a numpy array or scalar,
# array.array, mmap.mmap too); the call takes any.
BytesLike = Union[bytes, bytearray, memoryview, _array.array, mmap.mmap, np.ndarray,
                  np.generic]
# A kernel's source: text, or bytes (SPIR-V) of any of these types.
KernelSource = Union[str, bytes, bytearray, memoryview]
# A real number as the calls take it (alpha, beta, a timeout): numbers.Real, which
# int, float, fractions.Fraction and numpy's integer and floating scalars (longdouble
# too) are; float and the numpy classes are named for checkers that do not count them
# as numbers.Real.
Real = Union[float, numbers.Real, np.integer, np.floating]
# An integer: numbers.Integral (int, a numpy integer); not a bool where the call says so.
Integral = Union[int, numbers.Integral, np.integer]
# A flag (trans_a, inverse, all): a bool, a numpy bool, or the integer 0 or 1.
Flag = Union[bool, np.bool_, Integral]
# A shape, axes, a grid: an integer, or a sequence (any iterable, a 1-D numpy array) of
# integers.
Integers = Union[Integral, Iterable[Integral], np.ndarray]
_F = TypeVar("_F", bound=Callable[..., Any])

_BIG = 1 << 16          # bytes: a bin at least this large goes to the socket uncopied
_DIRECT_MIN = 1 << 16   # bytes: a buffer.read answer this large is received in place
_READ_CHUNK = 1 << 20   # bytes asked of recv at a time
_HEADROOM = 4096        # bytes of a task.run besides its operands' data, at most (staging)
# Bytes of a buffer.write request besides its data, at most: [0, msgid, "buffer.write",
# [{"buffer": id, "offset": off, "data": bin}]] is 1 + 1 + 5 (uint32 msgid) + 13 + 1 for
# the envelope, 1 + 7 + 9 + 7 + 9 + 5 for the map with its keys and 64-bit values, and 5
# for the longest bin header (as libdspkclient).  A buffer.read answer carries at most
# max_message - 64 data bytes (protocol.md, Limits).
_WRITE_FRAMING = 64
_READ_FRAMING = 64
_DEFAULT_MAX_MESSAGE = 268435456
_RESULT_FRAMING = 1024  # protocol.md: inline results may carry max_message - 1024 bytes
_SHARED_THRESHOLD = 1 << 20  # bytes: default of $DSPK_SHARED_THRESHOLD (as libdspkclient)
_TEMP_ROUND = 2 << 20   # shared temporaries: whole 2 MiB
# Idle shared temporaries are daemon buffers of the user's: they count toward max_buffers
# and the memory quotas (max_user_memory...), so few and small ones are kept for the next
# tasks; the others are freed as soon as their task is answered.
_TEMP_IDLE_MAX = 6      # idle shared temporaries kept, at most
_TEMP_IDLE_BYTES = 256 << 20  # bytes of the idle shared temporaries kept, at most
_TEMP_IDLE_QUOTA = 8    # ... and at most this fraction of hello's cpu_memory_quota
# A large result on cpu:0 is lent its shared temporary (a view of it, no copy) while at
# most this many of the client's temporaries are lent to results still alive; beyond
# that it is copied out (as libdspkclient's SHM_LENT_MAX).
_TEMP_LENT_MAX = 4
_TIMEOUT_FOREVER = 1e9  # seconds (31 years): a timeout above it waits for ever, as None
# proto/units.c's units, case-sensitive (docs/cli.md "Sizes")
_UNITS = {"": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
          "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40}


# Copies into and out of shared temporaries of at least _WIDE_MIN bytes are split over
# threads, one per online CPU up to _WIDE_MAX (numpy's copy lets the GIL go): one core
# does not reach the memory's bandwidth (libdspkclient does the same).  Threads are made
# per copy, so a fork leaves nothing behind.
_WIDE_MIN = 8 << 20
_WIDE_MAX = 4


def _copy_wide(dst: np.ndarray, src: np.ndarray, threads: Optional[int] = None) -> None:
    """dst[:] = src for two contiguous uint8 arrays of one length, on up to `threads`
    threads (default: the online CPUs, at most 4; one below _WIDE_MIN bytes), each
    part at least 4 MiB and 4 KiB-aligned; the calling thread copies a part too."""
    n = src.nbytes
    if threads is None:
        threads = min(os.cpu_count() or 1, _WIDE_MAX) if n >= _WIDE_MIN else 1
    k = max(1, min(threads, _WIDE_MAX, n // (_WIDE_MIN // 2)))
    if k == 1:
        np.copyto(dst, src)
        return
    cuts = [(n // k * i) & ~4095 for i in range(k)] + [n]

    def part(i: int) -> None:
        np.copyto(dst[cuts[i]:cuts[i + 1]], src[cuts[i]:cuts[i + 1]])

    started = []
    for i in range(1, k):
        t = threading.Thread(target=part, args=(i,), name="dspk-copy", daemon=True)
        try:
            t.start()
            started.append(t)
        except RuntimeError as e:  # no thread to be had: this one copies that part
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            part(i)
    part(0)
    for t in started:
        t.join()


def _parse_size(v: str) -> Optional[int]:
    """A size as proto/units.c (dspk__parse_size, which libdspkclient and every size
    option use) reads it, else None: ASCII digits and an optional unit spelled
    exactly K, KiB, M, MiB, G, GiB, T or TiB; no sign, space, newline, lower case,
    fraction or other digit; nothing beyond 64 bits (docs/cli.md "Sizes")."""
    n = 0
    while n < len(v) and "0" <= v[n] <= "9":
        n += 1
    if n == 0 or v[n:] not in _UNITS:
        return None
    count = int(v[:n])
    size = count * _UNITS[v[n:]]
    if count >= 1 << 64 or size >= 1 << 64:  # refused rather than wrapped
        return None
    return size


def _env_threshold() -> int:
    """``$DSPK_SHARED_THRESHOLD`` (a size: digits and an optional binary unit, K, M,
    G, T or KiB...; 0: never), else 1 MiB, as libdspkclient and dspk-submit: a value
    that is not a size by _parse_size is ignored, as libdspkclient ignores it."""
    size = _parse_size(os.environ.get("DSPK_SHARED_THRESHOLD", ""))
    return _SHARED_THRESHOLD if size is None else size


# Shared memory is mapped with libc's mmap through ctypes where it can be: Python 3.11's
# mmap.mmap keeps a dup of the file descriptor for the life of the mapping, so every
# shared array would hold one descriptor and a process could hold no more of them than
# RLIMIT_NOFILE.  A mapping made by libc keeps none (the memfd is closed right after).
try:
    import ctypes
    _libc: Any = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, ctypes.c_long]
    _libc.munmap.restype = ctypes.c_int
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc.madvise.restype = ctypes.c_int
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _MAP_FAILED = ctypes.c_void_p(-1).value
except (ImportError, OSError, AttributeError):  # no ctypes here: mmap.mmap, one fd each
    _libc = None


_CB_RECHECK = 0.01  # a callback waiting for a future completed by another thread looks
# again this often (the thread reading wakes no condition of the callbacks thread)
_POLL_MAX_MS = (1 << 31) - 1  # poll()'s longest wait; a longer one is waited again
# The files whose frames raise what is not a signal handler's (_foreign): this package
# (the client, its error classes) and msgpack (its pure-Python fallback decoder, and
# the frames its Cython decoder adds to a traceback, named "msgpack/_unpacker.pyx").
# The socket module's Python wrapper (socket.socket() is Python code over _socket, so
# what its constructor raises, EMFILE, ends in a frame of socket.py) counts as ours too:
# no signal handler is defined there.  So does concurrent.futures' _base.py, whose
# Future.result() raises the exception a future was failed with (the daemon's error,
# a dspk.Closed of the connection lost, a malformed answer): every synchronous call's
# error is raised there, and must not pass for a signal handler's (connect() names
# its socket on a hello refused or malformed only when it tells them apart).  A
# handler's exception raised while that file's code runs ends in the handler's frame.
_OURS = tuple(os.path.dirname(f) + os.sep for f in
              ((lambda: None).__code__.co_filename, msgpack.__file__ or "")) + \
    ("msgpack" + os.sep,) + \
    tuple(f for f in (getattr(_socket, "__file__", None), getattr(_cf, "__file__", None))
          if f)


# _no_cycle: an exception kept in a local of the frame that raised or caught it holds
# that frame (its traceback) and the frame holds it, with every other local of the
# frame: the operands, the request's future, the task's temporaries.  That reference
# cycle kept them (a lent operand's temporary, a future and its lent result, their
# daemon buffers) until a garbage collection (probe 22 C3).  The client sets such a
# local to None as it leaves the frame ("see _no_cycle").  So is a local holding a
# future whose exception is the one raised through that frame (TaskFuture.result()
# and exception(), the wrappers of the public methods, whose ``args`` hold the
# future): the future held the error, whose traceback held the frame.  A synchronous
# call's own future (Client._wait) is held by every frame of the call (_run's
# ``fut``, ``owner``, ``shm``...): the error it raises is taken out of the future,
# which keeps a copy without a traceback (_untraced_twin), so that no frame of the
# call reaches it (probe 22 C2).


class _Uncopyable:
    """A base of the client's objects that hold or stand for memory mapped in this
    process or a daemon buffer, a request, a lock or a thread of one connection (a
    shared array's _Mapping, a lent result's _Lease, a shared temporary, the claims,
    staged lists and jobs that own buffers): ``pickle``, ``copy.copy`` and
    ``copy.deepcopy`` raise TypeError naming it.  A copy would carry a raw address
    (read after the mapping is gone, or in another process: a crash) or a second
    owner of the same buffer that keeps nothing alive (a temporary given back, and
    written by a later task, while the copy's arrays still read it) (probe 22 C1, C2).
    numpy arrays made from them pickle and copy their data as any array."""
    __slots__ = ()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("cannot pickle or copy a dspk %s (%s of this process): pickle or copy "
                        "the numpy array made from it (numpy.array(a) copies its data)"
                        % (type(self).__name__, self._copy_what))

    _copy_what = "an object of one dspk connection"


class _Region(_Uncopyable):
    """A read-write MAP_SHARED mapping of a file descriptor that keeps no descriptor,
    unmapped when the region is collected (not at interpreter exit, when something
    might still read it).  It exports no memory (no array interface, no buffer): its
    bytes are reached through the one object that made it (a _Mapping, whose arrays
    hold it) or a lent result's _Lease, so that every array of a lent temporary's
    bytes holds the lease, never the region alone (probe 22 C2: an array made from
    the lease's mapping kept nothing lent, and the next result was written into it).
    pickle and copy: TypeError (_Uncopyable)."""
    __slots__ = ("address", "size", "__weakref__")
    _copy_what = "a mapping of shared memory"

    def __init__(self, fd: int, size: int) -> None:
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                          fd, 0)
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        self.address = addr
        self.size = size
        fin = weakref.finalize(self, _libc.munmap, addr, size)
        fin.atexit = False

    def madvise(self, advice: int) -> None:
        _libc.madvise(self.address, self.size, advice)  # advice only: failure is fine


class _Mapping(_Uncopyable):
    """The bytes of a _Region (``region``): ``numpy.asarray(mapping)`` is a uint8 array
    of them whose base is the mapping, so every view keeps the region mapped; it is
    unmapped once the last of them (and any lease of it) is collected.  A shared
    array's base, and a shared temporary's own view.  pickle and copy: TypeError
    (_Uncopyable)."""
    __slots__ = ("region", "address", "size", "__array_interface__", "__weakref__")
    _copy_what = "a mapping of shared memory"

    def __init__(self, fd: int, size: int) -> None:
        self.region = _Region(fd, size)
        self.address = self.region.address
        self.size = size
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1",
                                    "data": (self.address, False), "version": 3}

    def madvise(self, advice: int) -> None:
        self.region.madvise(advice)


def _memory_owner(a: Any) -> Any:
    """What ``a``'s memory is a view of, through arrays and memoryviews
    (``np.asarray(memoryview(x))`` included): the first object that is neither."""
    base: Any = a
    while True:
        if isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            return base


def _in_mapping(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a _Mapping (a shared array of some Client's)."""
    return isinstance(_memory_owner(a), _Mapping)


def _is_lent(a: Any) -> bool:
    """Whether ``a`` is a view of a _Lease (a lent result of some Client's, or a view
    of one)."""
    return isinstance(_memory_owner(a), _Lease)


def _new_memfd() -> io.FileIO:
    """A new memfd (close-on-exec, sealable) owned by a FileIO, which closes it when
    collected.  map() calls memfd_create and hands its descriptor straight to FileIO,
    in C: no signal handler can run between the two (CPython runs one only between
    bytecodes), so an interruption drops the FileIO, never a bare descriptor."""
    return next(map(io.FileIO, map(os.memfd_create, ("dspk-shared",),
                                   (os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING,)), ("r+",)))


def _map_fd(fd: int, size: int) -> Tuple[Any, np.ndarray]:
    """(mapping, its bytes as a uint8 array) of ``size`` bytes of ``fd``, shared and
    read-write; the caller may close ``fd`` at once."""
    m: Any = _Mapping(fd, size) if _libc is not None else mmap.mmap(fd, size)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # where shmem_enabled allows it
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass
    return m, (np.asarray(m) if _libc is not None else np.frombuffer(m, dtype=np.uint8))


def _os_error(what: str, e: OSError) -> Error:
    """The dspk.Error for an OSError of making shared memory: out of descriptors
    (EMFILE, ENFILE) LimitExceeded, out of memory OutOfMemory, EPERM/EACCES
    PermissionDenied, no memfd here NotSupported, else IOFailure."""
    text = "%s: %s" % (what, e.strerror or e)
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return _errors.LimitExceeded(text + " (the process's open file limit)")
    if e.errno in (errno.ENOMEM, errno.ENOSPC):
        return _errors.OutOfMemory(text)
    if e.errno in (errno.EPERM, errno.EACCES):
        return _errors.PermissionDenied(text)
    if e.errno in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return _errors.NotSupported(text)
    return _errors.IOFailure(text)


def _memfd_error(e: OSError) -> Error:
    """The dspk.Error for an OSError of memfd_create, in libdspkclient's words and codes
    (dspk.h, dspk_shared_alloc): no memfd on this kernel (ENOSYS, EINVAL, EOPNOTSUPP)
    dspk.NotSupported, one forbidden to this process (EPERM, EACCES: a seccomp filter
    or security policy) dspk.PermissionDenied, both saying that shared memory is
    unavailable (probe 23 B3: the bare "memfd_create: Function not implemented");
    else _os_error's."""
    if e.errno in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return _errors.NotSupported("shared memory is unavailable on this system "
                                    "(memfd_create: %s)" % (e.strerror or e))
    if e.errno in (errno.EPERM, errno.EACCES):
        return _errors.PermissionDenied(
            "shared memory is unavailable to this process (memfd_create: %s; a seccomp "
            "filter or security policy forbids it)" % (e.strerror or e))
    return _os_error("shared memory: memfd_create", e)


def _shm_size_error(size: int, e: OSError) -> Error:
    """The dspk.Error for an OSError of sizing or mapping a memfd of ``size`` bytes:
    past this process's file size limit (EFBIG, RLIMIT_FSIZE below ``size``: a memfd
    is a file) dspk.LimitExceeded naming it, in libdspkclient's words (probe 20 D4:
    it was dspk.IOFailure "File too large"); else _os_error's."""
    if e.errno == errno.EFBIG:
        try:
            import resource
            lim = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        except (ImportError, OSError, ValueError) as ex:  # not e: the handler unbinds it
            if from_signal_handler(ex):
                raise  # a signal handler's: the caller's, as it is
            lim = -1
        if lim != -1 and lim != getattr(resource, "RLIM_INFINITY", -1) and size > lim:
            return _errors.LimitExceeded(
                "shared memory of %d bytes: more than this process's file size limit "
                "(RLIMIT_FSIZE, %d bytes)" % (size, lim))
    return _os_error("shared memory of %d bytes" % size, e)


def _as_error(e: BaseException) -> BaseException:
    """``e`` as the dspk.Error a public method raises: a dspk.Error as it is; an OSError
    of a system call of the client's as _os_error maps it; a MemoryError (numpy could
    not allocate an array) dspk.OutOfMemory; a signal handler's exception (_foreign),
    or one that is no Exception (KeyboardInterrupt), as it is."""
    if isinstance(e, Error) or not isinstance(e, Exception) or _foreign(e):
        return e
    if isinstance(e, OSError):
        return _os_error("a system call of the client", e)
    if isinstance(e, MemoryError):
        return _errors.OutOfMemory("no memory for an array here: %s" % (e or "MemoryError"))
    return e


def _untraced_twin(e: BaseException) -> Optional[BaseException]:
    """A copy of ``e`` (its class, args and attributes, a dspk.Error's code, name,
    message and notes, as pickle and copy keep them) with no traceback, its cause
    and context those of ``e``; None where ``e`` cannot be copied.  A synchronous
    call's future keeps it in place of the error the call raises (see _no_cycle)."""
    try:
        twin = copy.copy(e)
    except Exception as e:  # noqa: BLE001 - an exception of a class that cannot be copied
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return None
    if type(twin) is not type(e) or twin is e:
        return None
    twin.__cause__, twin.__context__ = e.__cause__, e.__context__
    twin.__suppress_context__ = e.__suppress_context__
    return twin


def _untraced(fn: _F) -> _F:
    """A method that runs with this thread's trace function (sys.settrace: a debugger,
    a coverage tool, a tracer of the caller's) off, and put back as it returns.  A trace
    function runs Python code at every line, and an exception it raises (its signal
    handler's KeyboardInterrupt) is raised at that line of the traced frame: at the
    start of a ``finally`` before the lock it gives back, or at a ``with``'s exit before
    its __exit__ runs, where a handler alone never runs (CPython runs signal handlers
    as a C call returns and as a Python function starts): a lock or the right to send
    stayed held for good, a free was marked done and never sent.  Untraced, the
    client's own code is interrupted only where the handlers of an untraced program
    can interrupt it, which it is made safe against; the caller's tracer sees the
    method's call and return."""
    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        tracer = sys.gettrace()
        try:
            if tracer is None:
                return fn(*args, **kwargs)
            sys.settrace(None)
            try:
                return fn(*args, **kwargs)
            finally:
                sys.settrace(tracer)
        finally:
            args = kwargs = None  # type: ignore[assignment]  # see _no_cycle
    return cast(_F, method)


def _as_dspk_errors(fn: _F, untraced: bool) -> _F:
    """fn, with an OSError or MemoryError of the client's own (not a signal handler's)
    leaving it as the dspk.Error of _as_error, never as it is; and when ``untraced``,
    run with the thread's trace function off (_untraced), in the same wrapper (a call
    less on every call of the client's)."""
    @functools.wraps(fn)  # name, doc, and __wrapped__: inspect.signature sees fn's
    def method(*args: Any, **kwargs: Any) -> Any:
        tracer = sys.gettrace() if untraced else None
        if tracer is not None:
            sys.settrace(None)
        try:
            return fn(*args, **kwargs)
        except (OSError, MemoryError) as e:
            err = _as_error(e)
            try:
                if err is e:
                    raise
                raise err from None
            finally:
                err = None  # see _no_cycle
        finally:
            args = kwargs = None  # type: ignore[assignment]  # see _no_cycle
            if tracer is not None:
                sys.settrace(tracer)
    return cast(_F, method)


def _errors_as_dspk(fn: _F) -> _F:
    """fn, its own errors as dspk.Errors (_as_dspk_errors), traced as it is."""
    return _as_dspk_errors(fn, False)


def _public(fn: _F) -> _F:
    """A public method: untraced (_untraced), its own errors as dspk.Errors."""
    return _as_dspk_errors(fn, True)


class _Defer(Exception):
    """submit() on the caller's thread came to a step that would wait for an answer (a
    staged operand's or a large result's temporary buffer, a ``devices`` call), or to
    the sending of its task while earlier submit()s are still with the worker: the op
    goes to the client's worker thread instead (Client._defer)."""


class _Job(_Uncopyable):
    """One submit() handed to the client's worker thread: the op (``fn``, the bound
    ``_op_<name>``, and its arguments), the future submit() returned, and the future of
    the request the worker sent (``inner``; None until then).  ``stop``: canceled
    before its task was sent."""
    __slots__ = ("fn", "args", "kwargs", "progress", "future", "inner", "stop")

    def __init__(self, fn: Callable[..., "TaskFuture"], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any], progress: Optional[Progress],
                 future: "TaskFuture") -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.progress = progress
        self.future = future
        self.inner: Optional[TaskFuture] = None
        self.stop = False


class _Runner(_Uncopyable):
    """A client thread started by _launch: its token, the ident it runs on (0 until it
    runs), and the process that launched it (a child of fork() has no such thread)."""
    __slots__ = ("ident", "pid")

    def __init__(self) -> None:
        self.ident = 0
        self.pid = os.getpid()


def _launch(fn: Callable[..., None], *args: Any) -> None:
    """Starts ``fn(*args)`` on a new thread (RuntimeError when none can be had).  By
    _thread.start_new_thread, not threading.Thread.start(): start() waits for the new
    thread in Python code (an Event), and a signal handler's exception there left the
    Event's lock held, the new thread blocked for ever in its set() and the caller
    with a RuntimeError (taken for "no thread") in place of the interruption.  Here
    nothing waits: the thread starts in one C call, and ``fn`` itself takes up its
    work, so an interruption before or after that call leaves no half-started
    thread."""
    _thread.start_new_thread(fn, args)


class _HandOff(Exception):
    """_write_locked in submit() (``handoff``): the socket takes no more without
    waiting.  ``views`` (what is left of the message, the caller's list), ``anc`` (the
    descriptors, when none of the message went yet) and ``sent`` (its bytes written)
    go to the client's writer thread (Client._send_chunks)."""

    def __init__(self, views: List[memoryview], anc: List[Any], sent: int) -> None:
        super().__init__()
        self.views = views
        self.anc = anc
        self.sent = sent


class _ClosedWhileSending(Exception):
    """close() woke a thread waiting for room to send."""


class _LostWhileSending(Exception):
    """The socket's own sendmsg failed (EPIPE, ECONNRESET): the daemon is gone."""

    def __init__(self, err: OSError) -> None:
        super().__init__(err)
        self.err = err


def _foreign(e: BaseException) -> bool:
    """Whether ``e`` was raised by Python code outside this module: a signal handler
    that ran while this module waited in, or returned from, a system call (or the
    decoder).  What a socket call or msgpack's decoder raises itself comes from C
    code called here, so its traceback ends in a frame of this module; a handler's
    ends in the handler's own frame.  Such an exception is the caller's (it
    propagates), never a lost connection nor undecodable data."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not tb.tb_frame.f_code.co_filename.startswith(_OURS)


_SEND_RECHECK = 0.05  # seconds: a thread waiting to send looks again at least this often


def _wait_in(cond: threading.Condition, timeout: Optional[float]) -> None:
    """``cond.wait(timeout)``, the caller holding ``cond``'s lock (an RLock) by a
    ``with`` block, safe against interruptions.  threading.Condition.wait lets the lock
    go and takes it back in Python code: a signal handler's exception in between
    (KeyboardInterrupt on the main thread) left the lock not held by the ``with`` block
    that then let it go (RuntimeError instead of the interruption); and a plain lock's
    acquire() taken back while another thread holds it ends early, not holding it, when
    a handler raises meanwhile.  Here the lock is taken back by RLock._acquire_restore,
    which waits without running handlers, whatever interrupts the wait (also one that
    comes as _release_save returns, before its state is stored: then it is this
    thread's single hold, as every caller's ``with`` block has it), and the
    interruption propagates."""
    gate = _thread.allocate_lock()
    gate.acquire()
    waiters = cond._waiters  # type: ignore[attr-defined]
    waiters.append(gate)  # cond.notify()/notify_all() release it
    lock = cond._lock  # type: ignore[attr-defined]
    saved = None
    try:
        saved = lock._release_save()
        if timeout is None:
            gate.acquire()
        else:
            gate.acquire(True, timeout)
    finally:
        if saved is not None:
            lock._acquire_restore(saved)
        elif not lock._is_owned():  # let go, its state not stored
            lock._acquire_restore((1, threading.get_ident()))
        try:
            waiters.remove(gate)
        except ValueError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass  # removed by notify()


class _SendWaitTimeout(Exception):
    """_SendLock.claim: the deadline passed (never a signal handler's TimeoutError)."""


class _SendLock(_Uncopyable):
    """The right to write on the connection, safe against interruptions.

    A ``threading.Lock`` acquired by a call (``lock.acquire(timeout=...)``) cannot be
    released reliably: CPython runs signal handlers right after a C call returns, so a
    KeyboardInterrupt can arrive with the lock taken and before any ``try`` that would
    release it, and the lock then stays held for good.  Here the writer is a token
    stored in ``owner``: :meth:`claim` stores it (under ``mutex``, taken only by
    ``with`` blocks, which CPython does not interrupt between taking the lock and
    entering the block), and the writer's ``finally`` gives it back with no call before
    the store (``if sl.owner is token: sl.owner = None``), so whatever interrupts the
    writer, the right is given back exactly when it was taken.  A thread waiting for it
    is woken by :meth:`wake`, and looks again every _SEND_RECHECK seconds in case an
    interruption cut a wake-up.  ``mutex`` is re-entrant, so that nothing that runs
    inside it on the same thread (a garbage collection's finalizers) blocks on it."""
    __slots__ = ("mutex", "cond", "owner")

    def __init__(self) -> None:
        self.mutex = threading.RLock()
        self.cond = threading.Condition(self.mutex)
        self.owner: Any = None

    def locked(self) -> bool:
        """Whether some call holds the right to write."""
        return self.owner is not None

    def claim(self, token: Any, deadline: Optional[float], wait: bool = True,
              gone: Optional[Callable[[], Optional[BaseException]]] = None) -> bool:
        """Makes ``token`` the owner: at once when free (True); else False without
        ``wait``, or waits until ``deadline`` (time.monotonic(); None: for ever; past
        it: _SendWaitTimeout) or until ``gone()`` returns an exception, raised.
        The caller calls this inside the ``try`` whose ``finally`` gives it back."""
        with self.mutex:
            while self.owner is not None:
                if not wait:
                    return False
                err = gone() if gone is not None else None
                if err is not None:
                    raise err
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _SendWaitTimeout()
                _wait_in(self.cond, _SEND_RECHECK if left is None else min(left, _SEND_RECHECK))
            self.owner = token
            return True

    def wake(self) -> None:
        """Wakes the threads waiting in claim() (the owner gave it back, or the client
        closed)."""
        with self.mutex:
            if self.cond._waiters:  # type: ignore[attr-defined]  # (see _wait_in)
                self.cond.notify_all()


class _SharedRef(weakref.ref):
    """The weak reference to a shared array's mapping that owes its buffer.free when the
    array is collected: its callback is the client's ``_dead_shared.append`` (C code),
    which puts this reference, ``buffer`` and all, on the list of frees owed.  No
    Python code runs as the array is collected, so no signal handler can cut the
    noting (a ``weakref.finalize`` runs Python code, where a handler's exception is
    only reported as ignored, the buffer then never freed); the buffer.free goes with
    the client's next request (Client._flush_frees_locked)."""
    __slots__ = ("buffer",)

    def __new__(cls, ob: Any, callback: Callable[[Any], Any], buffer: int
                ) -> "_SharedRef":
        self = super().__new__(cls, ob, callback)
        self.buffer = buffer
        return self

    def __init__(self, ob: Any, callback: Callable[[Any], Any], buffer: int) -> None:
        super().__init__(ob, callback)


class _Claim(_Uncopyable):
    """The record that owns a buffer a call makes (buffer.create) from before its answer
    is read until the call hands the buffer over (the DeviceArray returned, the staged
    operand listed for its free): held by the call's frame, so an interruption anywhere
    in between drops it, and its _ClaimRef (``ref``) then owes the buffer a free.  No
    window between the answer and the record: the record exists before the answer."""
    __slots__ = ("ref", "__weakref__")

    def __init__(self) -> None:
        self.ref: Optional[_ClaimRef] = None


class _ClaimRef(weakref.ref):
    """The weak reference to a _Claim whose callback is the client's
    ``_dead_claims.append`` (C code: no signal handler can cut the noting): once the
    claim is collected, the buffer the future ``fut`` makes is owed a free, unless
    ``handed`` (set with no call right before the hand-over)."""
    __slots__ = ("fut", "handed")

    def __new__(cls, ob: Any, callback: Callable[[Any], Any], fut: TaskFuture
                ) -> "_ClaimRef":
        self = super().__new__(cls, ob, callback)
        self.fut = fut
        self.handed = False
        return self

    def __init__(self, ob: Any, callback: Callable[[Any], Any], fut: TaskFuture) -> None:
        super().__init__(ob, callback)


class _Staged(_Uncopyable, list):  # of buffer ids
    """The temporary buffers of a task's staged operands, with the _Claim of each
    (``claims``: buffer id -> claim): the claims live as long as this list, which
    travels from the staging to the code that frees the buffers (the task sent, or the
    staged future reading them back), so that an interruption anywhere on the way
    (a return, a call starting, before the ``try`` that frees them) drops the list
    and the claims free the buffers.  Each buffer freed on the normal path has its
    claim set handed (freed twice at worst)."""
    __slots__ = ("claims",)

    def __init__(self) -> None:
        super().__init__()
        self.claims: Dict[int, _Claim] = {}


def _orphan_buffer(fut: concurrent.futures.Future) -> Optional[int]:
    """The buffer a done buffer.create/buffer.import future made (None: it failed, was
    canceled, or names none).  concurrent.futures' state is read, not its methods:
    TaskFuture's exception() and result() would read the connection."""
    if fut._state != _cf.FINISHED or fut._exception is not None:  # type: ignore
        return None
    res = fut._result  # type: ignore[attr-defined]
    buf = res.get("buffer") if isinstance(res, dict) else None
    return buf if isinstance(buf, int) and not isinstance(buf, bool) else None


def _owed_buffer(item: Any) -> int:
    """The buffer id of an entry of Client._dead_shared (an int, or a _SharedRef)."""
    return item.buffer if isinstance(item, _SharedRef) else item


class _Temp(_Uncopyable):
    """A shared temporary of the automatic shared-memory path: a sealed memfd the
    daemon imported (``buffer.import``), reused by later tasks."""
    __slots__ = ("buffer", "device", "size", "mm", "view", "busy", "used", "held")

    def __init__(self, buffer: int, device: str, size: int, mm: Any,
                 view: np.ndarray, held: "_TempList") -> None:
        self.buffer = buffer
        self.device = device
        self.size = size
        self.mm = mm
        self.view = view
        self.busy = True
        self.used = 0  # when it was last made idle (Client._temp_clock)
        self.held = held  # the task's list holding it while busy (None when idle)


class _Lease(_Uncopyable):
    """What a lent result is a view of: ``numpy.asarray(lease)`` is the result itself
    (``dtype`` and ``shape`` at the start of a shared temporary's mapping), whose
    ``base`` is the lease, as python.md says.  It holds the mapping (``region``, a
    _Region, which exports no memory: the lease is the only way to the bytes from a
    lent result, so that every array of them keeps it lent), so that the mapping
    outlives every view, also past the client's close() or the temporary's free.  Its collection, once no view is left, is what gives the
    temporary back (_Lent): nothing runs then.  pickle and copy: TypeError
    (_Uncopyable): a copy carried the raw address (a crash once the mapping was
    gone, or in another process), and an array made from it kept nothing lent."""
    __slots__ = ("region", "__array_interface__", "__weakref__")
    _copy_what = "a lent result's lease, the mapping of a shared temporary"

    def __init__(self, region: _Region, address: int, dtype: np.dtype,
                 shape: Tuple[int, ...]) -> None:
        self.region = region
        # descr carries a structured dtype (dspk.bfloat16) whole; typestr alone would
        # be its bare "|V2".
        self.__array_interface__ = {"shape": tuple(shape), "typestr": dtype.str,
                                    "descr": dtype.descr, "data": (address, False),
                                    "version": 3}


class _Lent(weakref.ref):
    """The ``held`` of a shared temporary lent to a result (its arrays are views of the
    temporary, no copy made, as libdspkclient lends its temporaries): a weak reference
    to the result's _Lease whose callback is the client's ``_lent_back.append`` (C
    code: no Python code runs as the last view is collected, so no signal handler can
    cut anything and no lock is taken inside garbage collection).  The temporary stays
    busy while the lease lives; once it is collected, done_with() says so, and the
    next request (_start, seeing _lent_back) or _temp_get makes the temporary idle
    again (_temp_reclaim_locked).  The client closed, it is out of the list: the
    lease's mapping goes with the lease."""
    __slots__ = ()

    def __init__(self, ob: Any, callback: Callable[[Any], Any]) -> None:
        super().__init__(ob, callback)

    def done_with(self) -> Optional[int]:
        return None if self() is not None else 1


class _TempList(_Uncopyable, list):  # of _Temp
    """The shared temporaries one task holds (Client._run's ``shm``); ``fut``, the
    future whose completion ends their use (set as _run returns it); ``ended``, set
    as _run leaves by an exception (the first statement of its handlers: no signal
    handler runs before it); ``owner``, the futures of the requests _run made (those
    ``sent`` went out).  _temp_reclaim_locked gives a busy temporary back when its
    holder says its use has ended, even when the call that owed the put
    (_temps_done, or _run's own handler) was cut by an interruption.  ``leases``:
    the _Lease of each lent result the task reads in place (Client._lent_ref), held
    until the task is answered, so that no temporary the task reads goes back to the
    idle ones (to be written by another task) while it runs, even when the caller
    drops the result as its call is interrupted."""
    __slots__ = ("fut", "ended", "owner", "leases")

    def __init__(self, owner: List["TaskFuture"]) -> None:
        super().__init__()
        self.fut: Optional[concurrent.futures.Future] = None
        self.ended = False
        self.owner = owner
        self.leases: List[_Lease] = []

    def done_with(self) -> Optional[int]:
        """1: its temporaries are idle again (the task is answered, or none went out
        before _run ended); 2: its task was canceled (it may still run in the
        daemon: its temporaries are dropped); None: in use still."""
        fut = self.fut
        if fut is None:
            if not self.ended:
                return None  # _run is still making or sending the task
            sent = [f for f in self.owner if f._sent]
            if not sent:
                return 1
            fut = sent[-1]
        state = fut._state  # type: ignore[attr-defined]
        if state not in _DONE_STATES:
            return None
        return 1 if state == _cf.FINISHED else 2


def default_socket() -> str:
    """The socket path of docs/protocol.md: ``$DSPK_SOCKET`` when set and not empty (an
    empty one is as unset); else, unless root or in a Slurm job (``$SLURM_JOB_ID`` set
    and not empty), ``$XDG_RUNTIME_DIR/dspk/dspkd.sock`` when that is an absolute path;
    else ``/run/dspk/dspkd.sock``, the node's daemon."""
    env = os.environ.get("DSPK_SOCKET")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    # A relative XDG_RUNTIME_DIR is ignored, as the XDG Base Directory spec asks.
    if (os.geteuid() != 0 and xdg and xdg.startswith("/")
            and not os.environ.get("SLURM_JOB_ID")):
        return os.path.join(xdg, "dspk", "dspkd.sock")
    return "/run/dspk/dspkd.sock"


# Bytes of a Unix socket's path: sun_path (108) less its terminating NUL, as
# libdspkclient and dspk-submit take it (cli.md).
_SOCKET_PATH_MAX = 107


def _socket_path_error(path: str, given: bool) -> Optional[Error]:
    """dspk.LimitExceeded (ELIMIT, as libdspkclient and dspk-submit say it) for a socket
    path longer than _SOCKET_PATH_MAX bytes, naming where it came from (``given``: the
    caller's ``socket``; else $DSPK_SOCKET or the default); None for one that fits.
    A str that has no bytes form (a lone surrogate) is left to connect()."""
    try:
        n = len(os.fsencode(path))
    except UnicodeError as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return None
    if n <= _SOCKET_PATH_MAX:
        return None
    whence = "socket path from socket=" if given else \
        "socket path from $DSPK_SOCKET" if os.environ.get("DSPK_SOCKET") else \
        "default socket path"
    return _errors.LimitExceeded("cannot connect to dspkd at %s: %s longer than %d bytes "
                                 "(%d bytes)" % (path, whence, _SOCKET_PATH_MAX, n))


def _is_abstract(path: str) -> bool:
    """Whether ``path`` names an abstract socket: a leading '@' (python.md)."""
    return path.startswith("@")


def _address(path: str) -> Union[str, bytes]:
    """The address connect() takes for ``path``: for "@name" the abstract name (a NUL
    and the name's bytes, as systemd binds ListenStream=@name), else the path.
    Raises dspk.InvalidArgument for a lone "@"."""
    if not _is_abstract(path):
        return path
    if path == "@":
        raise _errors.InvalidArgument("socket: abstract socket name after '@' is empty "
                                      "(@NAME names an abstract socket)")
    try:
        return b"\0" + os.fsencode(path[1:])
    except UnicodeError as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return path  # no bytes form (a lone surrogate): left to connect(), as a path is


def _not_a_socket(path: str) -> str:
    """For connect()'s error: where ``path`` is there but is no socket, what it is
    ("; /tmp/x is a regular file, not a socket: ..."), as dspk-submit says it; else
    "" (no such path, a socket, or one stat() cannot look at)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return ""
    if _stat.S_ISSOCK(mode):
        return ""
    kind = "a directory" if _stat.S_ISDIR(mode) else \
        "a FIFO" if _stat.S_ISFIFO(mode) else \
        "a regular file" if _stat.S_ISREG(mode) else \
        "a character device" if _stat.S_ISCHR(mode) else \
        "a block device" if _stat.S_ISBLK(mode) else "a file of another kind"
    return "; %s is %s, not a socket: check connect()'s socket and $DSPK_SOCKET" \
        % (path, kind)


@_public
def connect(socket: Optional[SocketPath] = None, *,
            name: Optional[str] = None, timeout: Optional[Real] = None) -> "Client":
    """Connects to dspkd and returns a :class:`Client`.

    Args:
        socket: the socket path (str, bytes or path object), or ``"@name"`` for the
            abstract socket ``name`` (a leading '@' names the abstract namespace, as
            systemd's ``ListenStream=@name``; ``"./@x"`` is the file ``@x``); None:
            :func:`default_socket` (``$DSPK_SOCKET``, ...).
        name: the name of this connection in the daemon's ``status`` (a str, cut at 63
            bytes; default: "python:" and the script's file name, a byte of it that is
            no UTF-8 replaced by U+FFFD).
        timeout: seconds (more than 0) any one call may wait to connect, to send its
            request and for its answer before it raises :class:`dspk.Timeout` (None, inf
            or more than 1e9: wait for ever; a daemon that goes away always ends the wait
            with :class:`dspk.Closed`).  Futures of submit() wait as their result() says;
            the timeout bounds the sending of a submit()'s request too, ending its
            future (never submit()) with dspk.Timeout.

    Raises:
        dspk.ConnectError: no daemon listens there (with what the path is when it is
            there but is no socket: a regular file, a directory...).
        dspk.LimitExceeded: a socket path longer than 107 bytes (ELIMIT, naming where
            it came from: socket=, $DSPK_SOCKET or the default); no file descriptor for the socket or the wake-up pair
            (EMFILE, ENFILE); other OSErrors of making them as python.md's Errors
            says (never a bare OSError).
        dspk.InvalidArgument: a parameter of another type, timeout <= 0, a socket
            path or name holding a NUL character, or a socket "@" with no name.
        dspk.LimitExceeded, dspk.PermissionDenied: the daemon refused the connection
            (max_clients or max_user_clients; allow_users/allow_groups), with its
            reason.

    A client belongs to the process that connected: in a child of fork() its calls
    raise dspk.Closed, and the child's close() and exit leave the parent's connection
    and buffers alone.
    """
    return Client(socket, name=name, timeout=timeout)


# The deadline argument of the client's internal sends and waits when each is bounded
# by the client's timeout on its own; a call made of several requests (to_device: the
# buffer.create, its writes, the free of a failure) passes one deadline to them all.
_EACH: Any = object()


def _deadline_of(timeout: Optional[float]) -> Optional[float]:
    """The time.monotonic() deadline of a future's wait of ``timeout`` seconds; None for
    none (None, too large for a float, or above _TIMEOUT_FOREVER)."""
    if timeout is not None:
        try:
            timeout = float(timeout)
        except OverflowError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            timeout = None
    if timeout is None or timeout > _TIMEOUT_FOREVER:
        return None
    return time.monotonic() + timeout


# Seconds a thread other than the main one waits for a future's lock before it takes the
# lock for one left held for good (below, _FutureLock).
_FUTURE_LOCK_STALE = 1.0
_DONE_STATES = (_cf.CANCELLED, _cf.CANCELLED_AND_NOTIFIED, _cf.FINISHED)


class _FutureLock(_thread.RLock):
    """A TaskFuture's ``_condition``: concurrent.futures' methods take it by ``with``.

    ``threading.Condition``'s ``__enter__`` is Python code, so a signal handler can run
    right after it took its lock and before the ``with`` block is entered: the lock
    then stays held for good by the main thread (the only one that runs handlers), and
    the thread completing the future (the reader, the worker) blocked for ever.  This
    is the RLock itself, whose ``__enter__``/``__exit__`` are C code that no handler
    cuts.  It is no condition variable: nobody waits under it (TaskFuture.result()
    waits on a ``gate`` of its own, a plain lock that notify_all() releases and that
    the completing thread never waits for).  A lock left held all the same (the
    explicit acquire() of concurrent.futures.wait()'s, interrupted) is replaced: see
    TaskFuture._locked."""

    def __init__(self, gates: Optional[List[Any]] = None) -> None:
        # (_thread.RLock is made whole by its __new__: no super().__init__() to call)
        self.gates: List[Any] = [] if gates is None else gates

    def notify_all(self) -> None:
        """Wakes every waiter of result()/exception() (never waits)."""
        for gate in list(self.gates):
            try:
                gate.release()
            except RuntimeError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass  # released already

    notify = notify_all

    def wait(self, timeout: Optional[float] = None) -> bool:
        """As threading.Condition's (the caller holds the lock; a notify_all() wakes
        it).  concurrent.futures' own result() waits here; TaskFuture's never does (it
        reaches concurrent.futures' result() done only)."""
        gate = _thread.allocate_lock()
        gate.acquire()
        self.gates.append(gate)
        saved = self._release_save()  # type: ignore[attr-defined]
        try:
            if timeout is None:
                return gate.acquire()
            return gate.acquire(True, timeout) if timeout > 0 else gate.acquire(False)
        finally:
            self._acquire_restore(saved)  # type: ignore[attr-defined]
            try:
                self.gates.remove(gate)
            except ValueError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass


def _main_in_future_code() -> bool:
    """Whether the main thread runs code that may hold a future's lock: a method of
    concurrent.futures or of TaskFuture.  A lock it holds while running neither was
    left held by an interruption; one it holds while inside is still in use (the
    process was stopped, a debugger paused it) and must not be replaced."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # noqa: SLF001
    while frame is not None:
        code = frame.f_code
        if code.co_filename == _cf.__file__ or \
                getattr(code, "co_qualname", "").startswith("TaskFuture."):
            return True
        frame = frame.f_back
    return False


def _on_main() -> bool:
    """Whether this is the main thread, the one that runs signal handlers (by ident:
    threading.current_thread() on a thread started by _thread makes a dummy Thread)."""
    return _thread.get_ident() == _MAIN_IDENT[0]


# The main thread's ident (_on_main), as threading.main_thread() has it: a child of
# fork() has the thread that forked as its main thread (threading's own hook, run
# before this one, which registered later, made it so).
_MAIN_IDENT = [threading.main_thread().ident]
# How many fork()s made this process (0 in the one that imported dspk): a client made
# at another count is its parent's (Client._forked, without a getpid() system call
# on every request).
_FORKS = [0]


def _after_fork_in_child() -> None:
    _MAIN_IDENT[0] = threading.main_thread().ident
    _FORKS[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def _waiter_usable(waiter: Any) -> bool:
    """Whether a waiter of concurrent.futures.wait()/as_completed() on a future can be
    told (its add_result() sets a threading.Event): on a thread other than the main
    one, not when the Event's lock stayed held _FUTURE_LOCK_STALE seconds (an
    interruption of the main thread's wait left it held, and that wait() ended: nobody
    waits on it any more, and telling it would block for ever)."""
    if _on_main():
        return True
    lock = getattr(getattr(getattr(waiter, "event", None), "_cond", None), "_lock", None)
    if lock is None or not hasattr(lock, "acquire"):
        return True
    if not lock.acquire(timeout=_FUTURE_LOCK_STALE):
        return False
    lock.release()
    return True


class _Held(_Uncopyable):
    """A lock taken already, given back at the end of a ``with`` block (a thread other
    than the main one: no signal handler runs between the two)."""
    __slots__ = ("lock",)

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __enter__(self) -> Any:
        return self.lock

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


class TaskFuture(concurrent.futures.Future):
    """A :class:`concurrent.futures.Future` of one request.  ``msgid`` is its request's
    id; ``cancel()`` on a pending one also asks the daemon to drop the task.

    Done-callbacks and ``progress`` calls run on the client's ``dspk-callbacks``
    thread, in order.  ``result()`` and ``exception()`` called there (a callback that
    waits) run the callbacks due meanwhile, so that a settle queued behind progress
    calls is not waited for in vain; called on a thread that reads the connection they
    read it themselves until the future completes, as a synchronous call does."""
    _msgid: int = 0
    # Its request is written whole (set with no call after the last byte's count, so
    # that an interruption after that point still finds it): an answer will come.
    # Read by the client as this attribute (no call: an interruption cannot skip the
    # reading), by the user as the read-only ``sent``.
    _sent: bool = False
    # The Client that sent it: a msgid means something on its connection only.
    _owner: "Optional[weakref.ref[Client]]" = None
    # A submit() handed to the client's worker thread: its job (msgid is 0 until the
    # worker sent its task).
    _job: Optional[_Job] = None
    # Answered, its settle queued on the callbacks thread behind its progress calls.
    _queued: bool = False
    # How many of its done-callbacks ran (_invoke_callbacks).
    _ran: int = 0
    # Its request's method (a Timeout or a send error names it).
    _method: str = ""
    # The future of the request that carries this one's task, where that is another
    # (a worker's submit(), a task with staged results): ``sent`` reads it.
    _via: "Optional[TaskFuture]" = None
    # A submit()'s request whose rest the client's writer thread sends (the socket
    # took no more without waiting): a failure of that sending ends this future.
    _handed: bool = False

    def __init__(self) -> None:
        # concurrent.futures.Future.__init__'s state, but its threading.Condition,
        # which would be made only to be replaced (a cost of every call).
        self._condition: _FutureLock = _FutureLock()  # type: ignore[assignment]
        self._state = _cf.PENDING
        self._result = None
        self._exception = None
        self._waiters: List[Any] = []
        self._done_callbacks: List[Any] = []

    @property
    def msgid(self) -> int:
        """Its request's id (read-only; 0 until a worker's submit() sent its task)."""
        return self._msgid

    @property
    def sent(self) -> bool:
        """Whether its request was written whole to the socket (read-only: the client
        goes by it to know whether an answer will come).  For a submit() handed to
        the worker, or with staged results, the request of its task."""
        via = self._via
        return self._sent or (via is not None and via.sent)

    def _locked(self) -> Any:
        """The future's lock, for a ``with`` block.  On the main thread (the one that
        runs signal handlers) the RLock itself, taken by ``with`` as concurrent.futures
        takes it (C code: no handler runs between taking it and the block; one it left
        held itself, it takes again).  On another thread it is taken here; every
        _FUTURE_LOCK_STALE seconds of waiting, it looks whether the main thread runs a
        method of concurrent.futures' or of this class: when it does not, the lock
        was left held by an interruption of the main thread (concurrent.futures.wait()
        takes it by acquire()) and is replaced by a new lock (its waiters carried
        over), so the thread completing the future never blocks for ever; when it
        does (a process stopped, a debugger's pause), the wait goes on."""
        cond = self._condition
        if _on_main():
            return cond
        while not cond.acquire(timeout=_FUTURE_LOCK_STALE):
            if _main_in_future_code():
                continue  # held by a block that is still running (a debugger, SIGSTOP)
            cond = _FutureLock(cond.gates)
            cond.acquire()
            self._condition = cond
            break
        return _Held(cond)

    def _finish(self, result: Any, exception: Optional[BaseException]) -> None:
        """set_result()/set_exception() as concurrent.futures has them, under _locked().
        The callbacks run in a ``finally`` tried twice, by the call that changed the
        state: an interruption (a signal handler's KeyboardInterrupt, on the main
        thread) that lands after the state changed, or as the first attempt starts,
        leaves none unrun.  A future done already has its callbacks run once more
        only on the main thread (a settle once more after an attempt cut twice);
        another thread's attempt is never cut, and running them beside it ran the
        callbacks twice."""
        mine = False
        try:
            # (_locked(), whose main-thread case, the lock itself, is taken here)
            with self._condition if _thread.get_ident() == _MAIN_IDENT[0] else \
                    self._locked():
                if self._state in _DONE_STATES:
                    # Done by an earlier attempt that an interruption may have cut
                    # before it woke the waiters or ran the callbacks: this one does.
                    self._condition.notify_all()
                    if self._ran >= len(self._done_callbacks) or not _on_main():
                        raise concurrent.futures.InvalidStateError(
                            "{}: {!r}".format(self._state, self))
                    mine = True
                else:
                    mine = True  # (before the state: no call in between)
                    if exception is not None:
                        self._exception = exception
                    else:
                        self._result = result
                    self._state = _cf.FINISHED
                    try:
                        if self._waiters:
                            self._tell_waiters(exception)
                    finally:
                        if self._condition.gates:
                            self._condition.notify_all()
        finally:
            if mine and self._done_callbacks:
                try:
                    self._invoke_callbacks()
                except BaseException:  # noqa: B036 - an interruption: once more, then on
                    self._invoke_callbacks()
                    raise

    def _tell_waiters(self, exception: Optional[BaseException]) -> None:
        """Tells the waiters of concurrent.futures.wait()/as_completed() (under the
        future's lock)."""
        for waiter in self._waiters:
            if _waiter_usable(waiter):
                if exception is not None:
                    waiter.add_exception(self)
                else:
                    waiter.add_result(self)

    def _invoke_callbacks(self) -> None:
        """Runs the done-callbacks not run yet of a done future (nothing while it is
        pending), in order, each taken as run once it returned: an interruption
        before that (KeyboardInterrupt on the main thread) leaves it to the next
        attempt (the ``finally`` of _finish and _cancel, Client._run_ready), rather
        than never.  Two threads may run them at once (the main thread's cancel() or
        its settle once more, and the thread reading the answer): ``_ran`` is only
        ever set past a callback that ran, so none is skipped, and one may run twice
        here: a user's callback is posted once per attempt and runs once all the
        same (add_done_callback), the client's own settle what is settled already,
        which does nothing.  What a callback raises as an Exception is logged, as
        concurrent.futures does.  Once all ran, the future lets go of them (a new
        empty list; ``_ran`` stays, so a run beside this one, on the old list, ends
        as before and a settle once more finds nothing left to run): the client's
        own callbacks hold the futures they complete (a worker's submit() follows
        its task's future, a staged task's reads), which hold this one, and those
        reference cycles kept the futures, their lent results and their daemon
        buffers until a garbage collection (probe 22 C3)."""
        if self._state not in _DONE_STATES:
            return  # an interruption came before the state changed
        callbacks = self._done_callbacks
        while True:
            i = self._ran
            if i >= len(callbacks):
                if callbacks and callbacks is self._done_callbacks:
                    self._done_callbacks = []
                return
            try:
                callbacks[i](self)
            except Exception as e:
                if _interrupted_inline(callbacks[i], e):
                    raise  # not counted as run: see _add_inline
                _cf.LOGGER.exception("exception calling callback for %r", self)
            self._ran = i + 1

    # The executor's side of concurrent.futures.Future: a TaskFuture is completed by
    # its client from the daemon's answer (Client._settle calls _finish), so these are
    # refused to the user: set_result() made result() return a value the daemon never
    # sent (its answer then dropped), set_running_or_notify_cancel() made a future
    # running, which a TaskFuture never is (python.md, Futures).

    def set_result(self, result: Any) -> None:
        """Refused (dspk.NotSupported): a TaskFuture is completed by its client only,
        from the daemon's answer."""
        raise self._executor_only("set_result")

    def set_exception(self, exception: Optional[BaseException]) -> None:
        """Refused (dspk.NotSupported): a TaskFuture is completed by its client only,
        from the daemon's answer (cancel() or Client.cancel() stop its task)."""
        raise self._executor_only("set_exception")

    def set_running_or_notify_cancel(self) -> bool:
        """Refused (dspk.NotSupported): a TaskFuture is never running (its work runs
        in the daemon), and the client tells the waiters of a canceled one itself."""
        raise self._executor_only("set_running_or_notify_cancel")

    @staticmethod
    def _executor_only(name: str) -> Error:
        return _errors.NotSupported(
            "TaskFuture.%s(): the executor's side of concurrent.futures.Future; a "
            "TaskFuture is completed by its client from the daemon's answer (cancel() "
            "or Client.cancel() stop its task)" % name)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """pickle and copy: TypeError.  A TaskFuture is a request pending on one
        connection of this process, completed by that client's threads only."""
        raise TypeError("cannot pickle or copy a dspk.TaskFuture (a request of one "
                        "connection of this process): pickle its result() instead")

    def _notify_if_canceled(self) -> bool:
        """concurrent.futures.Future.set_running_or_notify_cancel for a canceled one,
        under _locked(): moves it on to CANCELLED_AND_NOTIFIED, its waiters told."""
        with self._locked():
            if self._state == _cf.CANCELLED:
                self._state = _cf.CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    if _waiter_usable(waiter):
                        waiter.add_cancelled(self)
                return False
            raise RuntimeError("Future in unexpected state")

    def done(self) -> bool:
        """As concurrent.futures.Future's, reading the state without the lock (one
        attribute: nothing to guard), so that no thread ever waits here."""
        return self._state in _DONE_STATES

    def cancelled(self) -> bool:
        """As concurrent.futures.Future's, without the lock (see done())."""
        return self._state in (_cf.CANCELLED, _cf.CANCELLED_AND_NOTIFIED)

    def running(self) -> bool:
        """As concurrent.futures.Future's, without the lock (see done())."""
        return self._state == _cf.RUNNING

    def _wait_done(self, timeout: Optional[float]) -> bool:
        """Waits until the future is done, or ``timeout`` (None: for ever): whether it
        is.  Outside the future's lock, on a gate of this waiter's that notify_all()
        releases: an interruption anywhere here leaves at most a gate in the list, and
        the completing thread never waits for a waiter."""
        if self._state in _DONE_STATES:
            return True
        gate = _thread.allocate_lock()
        gate.acquire()
        gates = self._condition.gates
        gates.append(gate)  # before the state is read again: notify_all() sees it
        try:
            if self._state in _DONE_STATES:
                return True
            if timeout is None:
                gate.acquire()
            elif timeout > 0:
                gate.acquire(True, timeout)
            return self._state in _DONE_STATES
        finally:
            try:
                gates.remove(gate)
            except ValueError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass

    def _pump(self, timeout: Optional[float]) -> Optional[float]:
        """Reads the connection until done when this thread reads it; returns the
        timeout left for Future's own wait (above 1e9 seconds: None, for ever)."""
        if isinstance(timeout, numbers.Real) and timeout > _TIMEOUT_FOREVER:
            timeout = None
        owner = self._owner() if self._owner is not None else None
        if owner is not None and not self.done() and owner._forked():
            raise owner._fork_error()  # nothing in this process will ever complete it
        if owner is not None and self._job is not None and not self.done() and \
                not owner._is_worker():
            owner._ensure_worker()  # jobs queued with no worker (an interrupted launch)
        if owner is not None and self._job is not None and not self.done() and \
                owner._is_worker():
            # A callback the worker runs waits for a later submit() of the worker's:
            # the worker is this thread, so it runs the jobs up to that one here.
            owner._work_until(self._job)
        if owner is not None and not self.done() and owner._is_callbacks_thread():
            # A callback waits: the callbacks queued before this future's settle (its
            # progress calls) run here, and a settle may be among them.
            owner._callbacks_wait(self, timeout)
            return 0
        if owner is not None and not self.done() and \
                (owner._is_reader() or owner._thread is None):
            # This thread reads the connection (a callback's wait), or no reader thread
            # runs (none could be started, or it ended as the connection closed): it
            # reads until the future is done.
            try:
                owner._pump_for(self, timeout)
            except Error as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                if owner._closed is None:
                    raise
                # The connection is closed and this future not yet failed (the thread
                # that found it closed is still failing the pending calls): it fails
                # with the connection's error here, so that exception() returns it
                # and result() raises it, as concurrent.futures has them.
                owner._settle(self, exc=e)
            return 0
        return timeout

    @_untraced
    def add_done_callback(self, fn: Callable[["concurrent.futures.Future[Any]"], Any]
                          ) -> None:
        """As concurrent.futures.Future's: ``fn(future)`` runs once the future is done,
        on the client's ``dspk-callbacks`` thread, after the callbacks (done-callbacks
        and ``progress`` calls) that came before it: never on the thread reading the
        connection, so that a callback may call the client and wait (a callback that
        waits holds back only the callbacks after it).  An exception the callback
        raises ends that callback only: an Exception is logged as concurrent.futures
        does (logger ``concurrent.futures``), and one that is not an Exception
        (SystemExit, KeyboardInterrupt) is ignored.  On a future already done ``fn``
        runs at once in the calling thread, as concurrent.futures runs it: an
        Exception it raises is logged and add_done_callback() returns normally; only
        one that is not an Exception (KeyboardInterrupt, SystemExit) propagates.
        ``fn`` that is not callable is a TypeError at once (it would fail only as the
        future completes, logged)."""
        if not callable(fn):
            raise TypeError("add_done_callback: fn must be callable, got %s" % _kind(fn))
        owner = self._owner
        if self.done() or owner is None:
            self._add_callback(fn)
            return

        once = _thread.allocate_lock()  # taken by the one run of fn (_run_once)

        def posted(f: "concurrent.futures.Future[Any]") -> None:
            client = owner()
            if client is None:  # no client left to run it: run here, as before
                _run_once(once, fn, f)
            else:
                client._post(_run_once, (once, fn, f))

        self._add_callback(posted)

    def _add_callback(self, fn: Callable[["concurrent.futures.Future[Any]"], Any]) -> None:
        """concurrent.futures.Future.add_done_callback, under _locked()."""
        with self._locked():
            if self._state not in _DONE_STATES:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception as e:
            if _interrupted_inline(fn, e):
                raise  # see _add_inline
            _cf.LOGGER.exception("exception calling callback for %r", self)

    def _add_inline(self, fn: Callable[["concurrent.futures.Future[Any]"], Any]) -> None:
        """The client's own done-callbacks: run where the future completes (the thread
        reading, the worker, a submit()'s writer thread, the dspk-callbacks thread for a settle queued behind
        progress calls), what they raise kept in them as for a user's callback; but
        a signal handler's exception (any class) that lands in one on the main thread
        is the caller's interruption, never the callback's own: it propagates from
        the call that completed the future (the caller's synchronous op), never logged
        and dropped as concurrent.futures does a user's callback's Exception, and the
        callback, not counted as run, runs again (whole) with the next attempt to
        settle the future (_finish's ``finally`` tries the callbacks a second time at
        once, so the client's own bookkeeping is done before the exception goes
        on)."""

        def guarded(f: "concurrent.futures.Future[Any]") -> None:
            try:
                fn(f)
            except Exception:
                raise  # concurrent.futures logs it (a signal handler's: see above)
            except BaseException:  # noqa: B036 - the callback's own: see above
                if _on_main():
                    # A signal handler's exception (the main thread read the answer):
                    # the interruption propagates, and the callback, not counted as
                    # run, runs again with the next attempt to settle the future
                    # (_run_ready, the next read): swallowed here, it was lost, and
                    # a future it completes (a worker's submit() following its
                    # task) stayed pending for ever.
                    raise

        guarded._dspk_inline = True  # type: ignore[attr-defined]  # _interrupted_inline
        self._add_callback(guarded)

    @_untraced
    def cancel(self) -> bool:
        """As concurrent.futures.Future's: True when the future is (now) canceled,
        False when it is done already (a TaskFuture is never RUNNING: its work runs in
        the daemon, and cancel() of a pending one also asks the daemon to drop it).
        A future canceled here is also moved on to the state that
        ``concurrent.futures.wait()`` and ``as_completed()`` count as done (the part an
        executor plays with ``set_running_or_notify_cancel()``): Future.cancel() alone
        wakes result() but not their waiters, which then waited for ever."""
        canceled = False
        try:
            canceled = self._cancel()
        finally:
            # Also when an interruption came after the state changed: the waiters of
            # wait()/as_completed() are told in any case (once more where an
            # interruption cuts the first attempt).
            try:
                self._notify_canceled()
            except BaseException:  # noqa: B036
                self._notify_canceled()
                raise
        return canceled

    def _notify_canceled(self) -> None:
        if self.cancelled():
            try:
                self._notify_if_canceled()  # False: canceled, waiters told
            except RuntimeError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass  # told already (another cancel() of it)

    def _cancel(self) -> bool:
        """concurrent.futures.Future.cancel, under _locked(); the callbacks run as in
        _finish (a ``finally`` tried twice, by the call that changed the state)."""
        mine = False
        try:
            with self._locked():
                if self._state in (_cf.RUNNING, _cf.FINISHED):
                    return False
                if self._state in (_cf.CANCELLED, _cf.CANCELLED_AND_NOTIFIED):
                    return True
                mine = True  # (before the state: no call in between)
                self._state = _cf.CANCELLED
                self._condition.notify_all()
            return True
        finally:
            if mine:
                try:
                    self._invoke_callbacks()
                except BaseException:  # noqa: B036 - an interruption: once more, then on
                    self._invoke_callbacks()
                    raise

    @_untraced
    def result(self, timeout: Optional[Real] = None) -> Any:
        """As concurrent.futures.Future's; the wait is outside the future's lock (see
        _wait_done), which is then taken for the result only.  A timeout that is not
        None or a real number is a TypeError, NaN a ValueError, as the wait of
        concurrent.futures would have them, said before any wait; any real number is
        taken (a numpy float32, a Fraction)."""
        try:
            if not self._wait_done(self._pump(_check_wait_timeout(timeout))):
                raise concurrent.futures.TimeoutError()
            return super().result(0)
        finally:
            self = None  # type: ignore[assignment]  # see _no_cycle (as concurrent.futures)

    @_untraced
    def exception(self, timeout: Optional[Real] = None) -> Optional[BaseException]:
        """As concurrent.futures.Future's (see result())."""
        try:
            if not self._wait_done(self._pump(_check_wait_timeout(timeout))):
                raise concurrent.futures.TimeoutError()
            return super().exception(0)
        finally:
            self = None  # type: ignore[assignment]  # see _no_cycle


def _check_wait_timeout(timeout: Any) -> Optional[float]:
    """A future's wait timeout as the waits take it: None (for ever, also for one
    above _TIMEOUT_FOREVER, 10**400 or inf), else a float of 0 or more (0: do not
    wait).  Any real number is taken (a bool is one, as it is to concurrent.futures;
    a numpy float32, a Fraction: a lock's acquire() takes only a float or an int, and
    refused them with "cannot be interpreted as an integer"); another type is a
    TypeError and NaN a ValueError."""
    if timeout is None:
        return None
    if not isinstance(timeout, numbers.Real):
        raise TypeError("timeout: seconds (a real number) or None, not %s"
                        % type(timeout).__name__)
    if timeout != timeout:  # NaN, of whatever real type
        raise ValueError("timeout: NaN is not a number of seconds")
    if isinstance(timeout, numbers.Integral):
        seconds = int(timeout)  # 10**400 too, which no float holds
        return None if seconds > _TIMEOUT_FOREVER else float(max(seconds, 0))
    try:
        f = float(timeout)
    except OverflowError as e:  # a Fraction (or another real) beyond float64
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        f = math.inf if timeout > 0 else -math.inf
    if f != f:  # NaN by float() of a real type that compares as a number
        raise ValueError("timeout: NaN is not a number of seconds")
    return None if f > _TIMEOUT_FOREVER else max(f, 0.0)


def _run_once(once: Any, fn: Callable[[Any], Any], fut: concurrent.futures.Future) -> None:
    """Runs a user's done-callback unless it ran already: it is posted by every
    attempt to run the future's callbacks that got that far (two threads settling
    the future at once, or an attempt cut by an interruption after the post and run
    again), and ``once`` (a lock, taken by C code in one step) lets only the first
    of those posts run it."""
    if once.acquire(False):
        _run_callback(fn, fut)


def _interrupted_inline(fn: Any, e: Exception) -> bool:
    """Whether ``e``, raised by done-callback ``fn``, is a signal handler's exception
    that landed in one of the client's own callbacks (_add_inline) on the main thread:
    the caller's interruption, which propagates (concurrent.futures logged it and
    dropped it, and the caller's synchronous op returned as if no signal came); a
    user's callback's Exception, or any on another thread, is logged."""
    return getattr(fn, "_dspk_inline", False) and _on_main() and from_signal_handler(e)


def _run_callback(fn: Callable[[Any], Any], fut: concurrent.futures.Future) -> None:
    """Runs a user's done-callback: an Exception it raises is logged as
    concurrent.futures logs it, one that is not an Exception is ignored."""
    try:
        fn(fut)
    except Exception:
        _LOGGER.exception("exception calling callback for %r", fut)
    except BaseException:  # noqa: B036 - the callback's own: see add_done_callback
        pass


class _Call(_Uncopyable):
    __slots__ = ("future", "decode", "progress", "is_async", "method")

    def __init__(self, future: TaskFuture, decode: Optional[Callable[[Any], Any]],
                 progress: Optional[Progress], is_async: bool, method: str = "") -> None:
        self.future = future
        self.decode = decode
        self.progress = progress
        self.is_async = is_async
        self.method = method


def _call_text(call: "_Call") -> str:
    """What an error of an answer names: its request's method and id."""
    msgid = call.future._msgid
    return "%s (request %d)" % (call.method, msgid) if call.method else \
        "request %d" % msgid


class _Malformed(Exception):
    """An answer whose shape is not protocol.md's ("Results of each method"): a field
    missing or of another type.  Its call fails with dspk.ProtocolError (_dispatch)."""


class _NoShared(Exception):
    """A shared temporary of an op could not be had (a dspk.Error of making it but
    Timeout and Closed): the op is made again without the shared-memory path
    (Client._run)."""


class _NotProtocol(Exception):
    """A message from the daemon that is no message of the protocol (not [1, msgid,
    error, result] nor [2, method, params], an ext type): the stream cannot be
    trusted, the connection is closed (_read_once)."""


def _no_ext(code: int, data: bytes) -> Any:
    """The decoder's ext_hook: an ext type is no part of the protocol."""
    raise _NotProtocol("the daemon sent an ext type (%d), which the protocol has not"
                       % code)


_KINDS: Dict[str, Callable[[Any], bool]] = {
    "uint": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "bin": lambda v: isinstance(v, bytes),
    "map": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _then(fn: Callable[[Any], Any], arg: Any, value: Any) -> Iterator[Any]:
    """An iterator, all C code, that calls ``fn(arg)`` and then yields ``value``:
    ``lst.extend(_then(fn, arg, value))`` stores ``value`` if and only if ``fn(arg)``
    returned, with no point in between where a signal handler runs (CPython runs
    one only between bytecodes of Python code), so that the list records exactly
    whether the step was done, wherever an interruption lands."""
    return map(_SECOND, zip(map(fn, (arg,)), (value,)))


# _then's iterator, written out where each call counts (the receive and send paths):
# ``map(_SECOND, zip(map(fn, (arg,)), (value,)))``, the same chain of C calls.
_SECOND = operator.itemgetter(1)


_PACKERS = threading.local()  # .p: this thread's msgpack.Packer (Client._encode)
_PACKER_KEEP = 1 << 20  # a Packer that packed a larger message is let go


def _new_unpacker() -> msgpack.Unpacker:
    # Text that is not valid UTF-8 (a device's name, a message) decodes with U+FFFD
    # for what is bad, as bytes.decode(errors="replace"): the answer is still the
    # protocol's, never a UnicodeDecodeError that closes the connection.
    return msgpack.Unpacker(raw=False, unicode_errors="replace", max_buffer_size=0,
                            ext_hook=_no_ext)


class _RState(NamedTuple):
    """Where the reading of the connection stands (Client._rlog[-1]): the bytes of
    the receive ``tok`` (Client._held) are filed up to ``pos``; ``fed`` bytes went to
    ``unpacker`` (a message starts where it consumed them all); ``direct``: the
    buffer.read answer being received in place, if any; ``fresh``: bytes were fed
    since the whole messages were last taken from the unpacker (work owed: the
    answer may be whole there, with no byte more to come)."""
    tok: Any
    pos: int
    fed: int
    direct: Optional["_Direct"]
    unpacker: msgpack.Unpacker
    fresh: bool = False


class _Direct(_Uncopyable):
    """A buffer.read answer received straight into its destination ``into``:
    ``recvs`` holds (token, bytes before, bytes received) of each recv_into, the
    last stored by C code as the call returns (the first: the bytes copied from the
    receive buffer)."""
    __slots__ = ("msgid", "call", "into", "n", "recvs")

    def __init__(self, msgid: int, call: Optional["_Call"], into: memoryview,
                 have: int) -> None:
        self.msgid = msgid
        self.call = call
        self.into = into
        self.n = into.nbytes
        self.recvs: List[Tuple[Any, int, int]] = [(None, 0, have)]

    def got(self) -> int:
        _, before, k = self.recvs[-1]
        return before + k


def _want(v: Any, kind: str, path: str) -> Any:
    """``v``, the field ``path`` of an answer, if of ``kind`` (_KINDS), else _Malformed."""
    if not _KINDS[kind](v):
        raise _Malformed("%s is %s, not a %s" % (path, _kind(v), kind))
    return v


def _field(m: Mapping[str, Any], key: str, kind: str, path: str = "result") -> Any:
    """Field ``key`` of the answer map ``m`` (at ``path``), present and of ``kind``."""
    if key not in m:
        raise _Malformed("%s.%s is missing" % (path, key))
    return _want(m[key], kind, "%s.%s" % (path, key))


# The limits of hello's answer, each required by protocol.md's table of results: a
# daemon's answer without one would turn off a check of the client's (max_elements
# before a copy, max_rank, max_buffers...) rather than be refused.
_HELLO_LIMITS = ("max_message", "max_depth", "max_objects", "max_rank", "max_elements",
                 "max_inflight", "max_unsent", "max_buffers", "max_clients",
                 "cpu_memory_quota")


def _decode_hello(res: Any) -> Tuple[str, int, Dict[str, int]]:
    """hello's answer: (daemon version, client id, limits), every limit a uint, each of
    _HELLO_LIMITS present and max_message at least 1."""
    _want(res, "map", "result")
    daemon = _field(res, "daemon", "str")
    client_id = _field(res, "client_id", "uint")
    limits = _field(res, "limits", "map")
    for k, v in limits.items():
        _want(k, "str", "a key of result.limits")
        _want(v, "uint", "result.limits.%s" % k)
    for k in _HELLO_LIMITS:  # each required: the client's own checks go by them
        _field(limits, k, "uint", "result.limits")
    if limits["max_message"] < 1:
        raise _Malformed("result.limits.max_message is 0")
    return daemon, client_id, dict(limits)


def _decode_devices(res: Any) -> Dict[str, Any]:
    """devices' answer, checked: ``devices`` (each with id, backend, software, ops and
    kernel_langs as the client reads them) and ``unavailable`` (backend, reason)."""
    _want(res, "map", "result")
    for i, d in enumerate(_field(res, "devices", "array")):
        path = "result.devices[%d]" % i
        _want(d, "map", path)
        for key, kind in (("id", "str"), ("backend", "str"), ("name", "str"),
                          ("type", "str"), ("memory", "uint"), ("software", "bool"),
                          ("ops", "map"), ("kernel_langs", "array")):
            _field(d, key, kind, path)
        for op, dts in d["ops"].items():
            _want(dts, "array", "%s.ops.%s" % (path, op))
    for i, u in enumerate(_field(res, "unavailable", "array")):
        path = "result.unavailable[%d]" % i
        _want(u, "map", path)
        _field(u, "backend", "str", path)
        _field(u, "reason", "str", path)
    return res


def _decode_map(res: Any) -> Dict[str, Any]:
    """An answer that must be a map (status)."""
    return _want(res, "map", "result")


def _decode_ping(res: Any) -> bytes:
    """ping's answer: the data echoed."""
    if type(res) is dict and type(res.get("data")) is bytes:
        return res["data"]  # the common case, as the checks below take it
    _want(res, "map", "result")
    return _field(res, "data", "bin")


def _decode_canceled(res: Any) -> bool:
    """task.cancel's answer: whether the request was still in flight."""
    _want(res, "map", "result")
    return _field(res, "canceled", "bool")


def _tensor_meta(t: Any, path: str) -> Tuple[np.dtype, Tuple[int, ...]]:
    """(dtype, shape) of the tensor ``t`` of an answer (at ``path``), checked as
    protocol.md's table of results has it: a map with a known ``dtype``, a ``shape`` of
    uints, and inline ``data`` of exactly the bytes of that shape, or a ``buffer`` (uint)
    and an ``offset`` (uint, optional)."""
    _want(t, "map", path)
    name = _field(t, "dtype", "str", path)
    if name not in _dtypes.DTYPES:
        raise _Malformed("%s.dtype is %r, a dtype the client does not know" % (path, name))
    dt = _dtypes.DTYPES[name]
    shape = tuple(_want(n, "uint", "%s.shape[%d]" % (path, i))
                  for i, n in enumerate(_field(t, "shape", "array", path)))
    if t.get("data") is not None:
        n = len(_field(t, "data", "bin", path))
        if n != math.prod(shape) * dt.itemsize:
            raise _Malformed("%s.data is %d bytes, not the %d of %s %s"
                             % (path, n, math.prod(shape) * dt.itemsize, name, shape))
    else:
        if "buffer" not in t:
            raise _Malformed("%s has neither data nor buffer" % path)
        _field(t, "buffer", "uint", path)
        if t.get("offset") is not None:
            _field(t, "offset", "uint", path)
    return dt, shape


_Expect = Tuple[str, List[Tuple[np.dtype, Tuple[int, ...]]]]


def _task_outputs(res: Any, count: int, expect: Optional[_Expect] = None
                  ) -> List[Dict[str, Any]]:
    """task.run's answer: ``result.outputs``, checked (_tensor_meta), ``count`` of them
    (an op's one result, a kernel's every tensor); ``expect`` (op, [(dtype, shape)...])
    the first results as the client computed them for the op's operands, where it can."""
    _want(res, "map", "result")
    outs = _field(res, "outputs", "array")
    if len(outs) != count:
        raise _Malformed("result.outputs has %d items, not %d" % (len(outs), count))
    metas = [_tensor_meta(t, "result.outputs[%d]" % i) for i, t in enumerate(outs)]
    for i, (got, want) in enumerate(zip(metas, expect[1] if expect is not None else [])):
        if got != want:
            raise _Malformed("result.outputs[%d] is %s %s, where %s of these operands "
                             "gives %s %s" % (i, wire_name(got[0]), got[1], expect[0],
                                              wire_name(want[0]), want[1]))
    return outs


def _out_refusal(out: Any) -> str:
    """The one message for an ``out=`` of a type that takes no result (a list, a numpy
    scalar, a plain numpy array in the process's own memory, a lent result...): it
    names every type that does.  A lent result is memory shared with the daemon, but
    the client's temporary lent to the caller, not an empty_shared() array: said so."""
    if _is_lent(out):
        got = ("a lent result (a view of a shared temporary the client lent to an op's "
               "result, not an empty_shared() array)")
    elif isinstance(out, np.ndarray):
        got = "a numpy array not in shared memory"
    else:
        got = _kind(out)
    return ("out= must be a DeviceArray or a shared array (Client.empty_shared, or a "
            "C-contiguous slice of one) of this connection, got %s" % got)


def _foreign_array(what: str, d: "DeviceArray") -> str:
    """The message for a DeviceArray of another client passed to an op of this one: its
    buffer id means nothing (or another buffer) on this connection."""
    return ("%s: a DeviceArray of another connection (buffer %d of that client's "
            "connection; buffers belong to the connection that made them): pass it to "
            "an op of its own client, or its .numpy() here" % (what, d.buffer))


_FREE_CLAIM = _thread.allocate_lock()  # DeviceArray.free()'s claim, held for a flag


class DeviceArray:
    """A tensor in a daemon-side buffer (``buffer.create``), owned by one connection.

    Pass it as an operand of any op (the task reads it where it is) or as ``out=`` (the
    result stays on the device).  ``numpy()`` copies it back; ``free()`` releases it (also
    when the connection closes).  Usable as a context manager that frees it.
    """

    def __init__(self, client: "Client", buffer: int, device: str, shape: Tuple[int, ...],
                 dtype: np.dtype, offset: int = 0, size: Optional[int] = None) -> None:
        # Read-only (properties below): the client goes by them, so an assignment
        # would read or free another buffer, or pass another connection's as this one's.
        self._client = client
        self._buffer = buffer
        self._device = device
        self._shape = tuple(int(n) for n in shape)
        self._dtype = np.dtype(dtype)
        self._offset = offset
        self._size_bytes = size if size is not None else self.nbytes
        self._freed = False
        self._freeing = False  # a free() claimed it (free())

    @property
    def client(self) -> "Client":
        """The Client whose connection holds the buffer (read-only)."""
        return self._client

    @property
    def buffer(self) -> int:
        """The daemon's buffer id, on ``client``'s connection (read-only)."""
        return self._buffer

    @property
    def device(self) -> str:
        """The device the buffer is on (read-only)."""
        return self._device

    @property
    def shape(self) -> Tuple[int, ...]:
        """The tensor's shape (read-only)."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The tensor's dtype (read-only)."""
        return self._dtype

    @property
    def offset(self) -> int:
        """The tensor's first byte in the buffer (read-only): 0 for a DeviceArray of
        ``empty()`` or ``to_device()``; where the daemon's answer names it, for a
        result in a buffer (a kernel's)."""
        return self._offset

    @property
    def size_bytes(self) -> int:
        """Bytes of the buffer (read-only): the ``size`` of the daemon's answer to
        ``buffer.create`` for a DeviceArray of ``empty()`` or ``to_device()``, else
        ``nbytes``."""
        return self._size_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (product of the shape times the item size; read-only)."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        """The number of axes, len(shape) (read-only)."""
        return len(self.shape)

    @_public
    def numpy(self) -> np.ndarray:
        """A numpy copy of the tensor (``buffer.read``, in chunks below the daemon's
        message limit)."""
        self._live("numpy()")
        return self.client._read_array(self)

    @_public
    def free(self) -> None:
        """Frees the buffer (``buffer.free``); requests already sent still see it.  A
        second free() of the same DeviceArray does nothing, and so does one after its
        client closed (the buffer went with the connection)."""
        # One free() of a DeviceArray frees it: the first to claim it, under a lock,
        # while it waits for the submit()s before it (probe 23 G1: two threads both got
        # past the check during that wait; the second buffer.free was ENOBUF).
        with _FREE_CLAIM:
            if self._freed or self._freeing:
                return
            self._freeing = True
        if not self._freed:
            if not self.client.closed:
                # The submit()s made before, which may use this array, are sent first,
                # before it is marked freed (the worker refuses a freed operand).
                try:
                    self.client._after_jobs("buffer.free")
                except BaseException:  # noqa: B036 - not freed: a later free() may
                    self._freeing = False
                    raise
            self._freed = True
            try:
                if self.client.closed:  # the buffer went with the connection
                    return
                self.client._free_buffer(self.buffer)
            except BaseException:  # noqa: B036 - KeyboardInterrupt, dspk.Timeout...
                # Not known to be freed: freed without waiting (a second free of an
                # id the daemon never reuses is harmless), and the exception goes on.
                self.client._queue_free(self.buffer)
                raise

    def _live(self, what: str) -> None:
        """dspk.NoBuffer (ENOBUF, the daemon's code for it) when this DeviceArray was
        freed by free(): the client knows it, the daemon would only say "no buffer N".
        After its client closed, the call's own dspk.Closed says more."""
        if self._freed and not self.client.closed:
            raise _errors.NoBuffer("%s: this DeviceArray was freed (buffer %d, free() or "
                                   "its with-block)" % (what, self.buffer))

    def _ref(self) -> Dict[str, Any]:
        return {"buffer": self._buffer, "offset": self._offset, "dtype": wire_name(self._dtype),
                "shape": list(self.shape)}

    def __enter__(self) -> "DeviceArray":
        return self

    @_untraced
    def __exit__(self, *exc: Any) -> None:
        try:
            self.free()
        except _errors.Closed as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass

    # numpy's operators and ufuncs with a DeviceArray operand (``np.add(x, d)``,
    # ``x + d``, ``d * 2``): TypeError at once, before numpy looks at the operand
    # any further (it could otherwise make an object array holding it).
    __array_ufunc__ = None

    def _no_arithmetic(self, *other: Any) -> Any:
        raise TypeError("a dspk.DeviceArray supports no arithmetic here (its data is in a "
                        "daemon buffer): use the client's ops, or its .numpy() for a copy")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arithmetic
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _no_arithmetic
    __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _no_arithmetic
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _no_arithmetic
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _no_arithmetic
    __neg__ = __pos__ = __abs__ = __invert__ = _no_arithmetic

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """``numpy.asarray(d)`` and friends: TypeError (the data is in a daemon buffer:
        ``d.numpy()`` copies it here, one explicit round trip), never an object array."""
        raise TypeError("a dspk.DeviceArray is not a numpy array (its data is in a "
                        "daemon buffer): use its .numpy() for a numpy copy")

    def __reduce_ex__(self, protocol: Any) -> Any:
        """pickle and copy: TypeError.  A DeviceArray names a buffer of one connection
        of this process; a copy would free it twice, another process could not use it."""
        raise TypeError("cannot pickle or copy a dspk.DeviceArray (a buffer of one "
                        "connection): pickle its .numpy() instead")

    def __repr__(self) -> str:
        return "DeviceArray(buffer=%d, device=%r, shape=%r, dtype=%s%s)" % (
            self.buffer, self.device, self.shape,
            "dspk.bfloat16" if self.dtype == _dtypes.bfloat16 else self.dtype,
            ", freed" if self._freed else "")


# The checks of the parameters that are not arrays: each refuses another type with
# dspk.InvalidArgument naming the parameter, before anything is sent (float() and
# bool() would take "2", True or "no" and send something the caller did not mean;
# a complex alpha would fail inside float() with a bare TypeError).

def _number(name: str, v: Any) -> float:
    """v (a real number: int, float, numpy scalar; not a bool) as a float; one no
    float64 holds (10**400, a numpy longdouble beyond 1.8e308) is InvalidArgument."""
    if type(v) is float:  # the common case, and every float is one
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise _errors.InvalidArgument("%s: expected a real number, got %s"
                                      % (name, _kind(v)))
    try:
        with np.errstate(over="ignore"):
            f = float(v)
    except (OverflowError, ValueError, TypeError) as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        f = math.inf
    except Exception as e:  # noqa: BLE001 - what the object's __float__ raises: named
        if isinstance(e, (Error, MemoryError)) or from_signal_handler(e):
            raise
        raise _errors.InvalidArgument("%s: %s" % (name, _errors._describe(e))) from e
    else:
        # an infinity itself, or a finite value beyond float64 (an int, a Fraction, a
        # longdouble, another real type: never equal to an infinity)
        if not math.isinf(f) or user_code(name, lambda: bool(v == f)):
            return f
    raise _errors.InvalidArgument("%s: %s is beyond what a float64 holds"
                                  % (name, _num_text(v)))


def _scalar(name: str, v: Any, f32: bool) -> Union[int, float]:
    """v (a real number, as _number) as sent for an op's alpha or beta: an integer of
    64 bits (-2^63 to 2^64-1) as that int, which the daemon rounds once to the type the
    op uses; a float64 or narrower float as it is; any other value (a longdouble, an
    int beyond 64 bits, a Fraction, another numbers.Real) rounded once from its exact
    value (_exact_ratio: never its float(), which need not agree) to the nearest f32
    when ``f32`` (the op computes in f32), else to the nearest float64.  Never an int or longdouble through float64 on its way to f32: that rounds
    twice (2**53 + 2**29 + 1 became the tie 2**53 + 2**29, then 2**53, not 2**53 +
    2**30).  A value no float64 holds is InvalidArgument whatever the op's type."""
    if type(v) is float:
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return _number(name, v)  # its InvalidArgument
    if isinstance(v, numbers.Integral):
        n = user_code(name, int, v)  # its __index__ or __int__ may raise: named
        if -(1 << 63) <= n < 1 << 64:
            return n
        v = n
    elif isinstance(v, (float, np.floating)) and np.dtype(type(v)).itemsize <= 8:
        return _number(name, v)  # exact (a float subclass's __float__ may raise: named)
    # float() of an int, Fraction, longdouble or other real: NaN and the infinities,
    # and the InvalidArgument of a value beyond float64 (also for an f32 op: never
    # ERANGE for a value the caller did not pass)
    f64 = _number(name, v)
    if math.isnan(f64) or math.isinf(f64):
        return f64
    if isinstance(v, np.floating):  # a longdouble: float() rounds it once, exactly
        if not f32:
            return f64
        # To odd at float64's precision, then to nearest at f32's: one rounding (as
        # to_bfloat16).
        d = float(_dtypes._f64_round_to_odd_wide(np.array([v]))[0])
    else:
        # Any other real from its exact value (float() of another library's type
        # need not be its nearest float64, nor say the same as its ratio).
        exact = _exact_ratio(name, v)
        if exact is None:  # a real type with no exact ratio: through its float()
            if not f32:
                return f64
            d = f64
        elif not f32:
            try:
                return float(exact)  # int / int: correctly rounded, once
            except OverflowError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                raise _errors.InvalidArgument("%s: %s is beyond what a float64 holds"
                                              % (name, _num_text(v))) from None
        else:
            d = float(_dtypes._python_reals(np.array([exact], dtype=object))[0])
            if math.isinf(d):  # rounded to odd from beyond float64
                raise _errors.InvalidArgument("%s: %s is beyond what a float64 holds"
                                              % (name, _num_text(v)))
    with np.errstate(over="ignore"):
        f = float(np.float32(d))
    # beyond f32's range: the double itself, which the daemon refuses (ERANGE)
    return d if math.isinf(f) and not math.isinf(d) else f


def _zero_as_used(v: Union[int, float], f32: bool) -> bool:
    """Whether v (as _scalar sends it) is 0 (of either sign) as the op computes with
    it: rounded to the nearest f32 (ties to even) when ``f32``, as the daemon does
    (1e-50 and 7e-46 are 0 there, 1.5e-45 is not; a nonzero int never is)."""
    if isinstance(v, int) or not f32:
        return v == 0
    with np.errstate(over="ignore"):
        return float(np.float32(v)) == 0.0


def _exact_ratio(name: str, v: Any) -> Optional[fractions.Fraction]:
    """The exact value of a real number v that is neither a float nor a numpy scalar:
    an int, a numbers.Rational (Fraction), a type with ``as_integer_ratio()`` (as
    float, decimal and gmpy2's types have), else one with integer ``numerator`` and
    ``denominator`` attributes; None for a real type with none of these.  What the
    object's methods raise is InvalidArgument naming ``name``, and so is a ratio that
    is not two integers (the denominator more than 0)."""
    if isinstance(v, int):
        return fractions.Fraction(v)
    if isinstance(v, numbers.Rational):
        return user_code(name, lambda: fractions.Fraction(int(v.numerator),
                                                          int(v.denominator)))
    ratio = user_code(name, getattr, v, "as_integer_ratio", None)
    if ratio is not None:
        nd = user_code(name, ratio)
        what = "as_integer_ratio() gave"
    else:
        num = user_code(name, getattr, v, "numerator", None)
        den = user_code(name, getattr, v, "denominator", None)
        if num is None or den is None:
            return None
        nd = (num, den)
        what = "numerator and denominator are"
    if not (isinstance(nd, tuple) and len(nd) == 2 and
            all(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))
                for x in nd)):
        raise _errors.InvalidArgument("%s: %s.%s %s, not two ints"
                                      % (name, type(v).__name__, what, _kind(nd)))
    n, d = user_code(name, int, nd[0]), user_code(name, int, nd[1])
    if d <= 0:
        raise _errors.InvalidArgument("%s: %s.%s %d and %d, not a denominator of 1 or "
                                      "more" % (name, type(v).__name__, what, n, d))
    return fractions.Fraction(n, d)


def _f32_op(op: str, x: Any) -> bool:
    """Whether op ("gemm", "map") with first operand x uses its scalars as f32
    (protocol.md: a gemm of f32, f16 or bf16; a map of f32 or c64)."""
    try:
        dt = _meta(x, "input 0")[1]
    except (ValueError, TypeError, Error) as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return False  # not an array: refused elsewhere
    if op == "gemm":
        return dt != np.float64
    return dt in (np.float32, np.complex64)


def _int64(name: str, v: Any) -> int:
    """v (an integer, see _integer) that msgpack carries: -2^63 to 2^64-1."""
    n = _integer(name, v)
    if not -(1 << 63) <= n < 1 << 64:
        raise _errors.InvalidArgument("%s: %d is beyond 64 bits" % (name, n))
    return n


def _integer(name: str, v: Any) -> int:
    """v (an int or numpy integer; not a bool, float or str) as an int."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise _errors.InvalidArgument("%s: expected an integer, got %s" % (name, _kind(v)))
    return user_code(name, int, v)  # its __int__ or __index__ may raise


def _flag(name: str, v: Any) -> bool:
    """v (a bool, numpy bool, or the integer 0 or 1) as a bool."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, numbers.Integral):
        n = user_code(name, int, v)  # its __int__ may raise
        if n in (0, 1):
            return bool(n)
    raise _errors.InvalidArgument("%s: expected a bool, got %s" % (name, _kind(v)))


def _string(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _errors.InvalidArgument("%s: expected a str, got %s" % (name, _kind(v)))
    return v


def _device(v: Any) -> str:
    """``device`` (a device id of devices(), or "any"): a str the wire carries.  None
    or another type is InvalidArgument naming it, before anything is sent (None was
    sent as no device at all: the daemon's default, where the caller meant none)."""
    _string("device", v)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 for the daemon
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        raise _errors.InvalidArgument("device: %r is not valid Unicode text (%s)"
                                      % (v, e.reason)) from None
    return v


def _integers(name: str, v: Any) -> List[int]:
    """v (an integer, or a sequence or 1-D array of integers) as a list of ints."""
    if isinstance(v, (str, bytes)) or not (isinstance(v, (numbers.Integral, np.ndarray))
                                           or hasattr(v, "__iter__")):
        raise _errors.InvalidArgument("%s: expected an integer or a sequence of integers, "
                                      "got %s" % (name, _kind(v)))
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (numbers.Integral, np.bool_)):
        return [_int64(name, v)]
    items = user_code(name, list, v)  # its __iter__ or __getitem__ may raise
    return [_int64("%s[%d]" % (name, i), n) for i, n in enumerate(items)]


def _shape(v: Any) -> Tuple[int, ...]:
    """A shape (an integer or a sequence of them, each >= 0) as a tuple.  A dimension
    beyond int64 (2^63 or more: the daemon's limit, whatever msgpack could carry) is
    dspk.LimitExceeded, as the daemon would say; a product of them too large is
    _nbytes'."""
    if isinstance(v, (str, bytes)) or not (isinstance(v, (numbers.Integral, np.ndarray))
                                           or hasattr(v, "__iter__")):
        raise _errors.InvalidArgument("shape: expected an integer or a sequence of "
                                      "integers, got %s" % _kind(v))
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (numbers.Integral, np.bool_)):
        shape: Tuple[int, ...] = (_integer("shape", v),)
    else:
        items = user_code("shape", list, v)  # its __iter__ or __getitem__ may raise
        shape = tuple(_integer("shape[%d]" % i, n) for i, n in enumerate(items))
    if any(n < 0 for n in shape):
        raise _errors.InvalidArgument("shape: %s has a negative dimension" % (shape,))
    if any(n > (1 << 63) - 1 for n in shape):
        raise _errors.LimitExceeded("shape %s: a dimension beyond int64" % (shape,))
    return shape


def _dtype(v: Any) -> np.dtype:
    """v (anything numpy.dtype takes) as a numpy dtype that dspk has, little-endian:
    the daemon's data is little-endian, and a big-endian dtype (">f4") would read its
    bytes swapped."""
    try:
        dt = user_code("dtype", np.dtype, v)
    except _errors.InvalidArgument as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        if isinstance(e.__cause__, (TypeError, ValueError)):
            raise _errors.DtypeError("dtype: %s" % e.__cause__) from None
        raise
    wire_name(dt)  # raises DtypeError
    if dt.byteorder not in ("<", "|") and not (dt.byteorder == "=" and
                                               sys.byteorder == "little"):
        dt = dt.newbyteorder("<")
    return dt


def _kernel_args(args: Any) -> List[Dict[str, Any]]:
    """kernel's ``args``: a sequence of one-key dicts, {"tensor": i} or a scalar of its
    type ({"i32": v}...; the daemon checks the key and the range).  Each is named as
    the daemon names it, ``options.args[i]`` (protocol.md), whichever side refuses it:
    a value the client refuses (beyond msgpack's ints, or beyond float64) and one the
    daemon refuses (beyond the type's own range) read alike."""
    if isinstance(args, (str, bytes, Mapping)) or not hasattr(args, "__iter__"):
        raise _errors.InvalidArgument("options.args: expected a list of one-key dicts, "
                                      "got %s" % _kind(args))
    out = []
    for i, a in enumerate(user_code("options.args", list, args)):  # its __iter__ may raise
        items = user_code("options.args[%d]" % i, lambda m: list(m.items()), a) \
            if isinstance(a, Mapping) else None
        if items is None or len(items) != 1:
            raise _errors.InvalidArgument("options.args[%d]: expected a one-key dict "
                                          "such as {\"tensor\": 0} or {\"f32\": 1.5}, "
                                          "got %s"
                                          % (i, _kind(a)))
        (k, v), = items
        what = "options.args[%d]" % i
        if k in ("f32", "f64"):
            try:
                v = _scalar(what, v, k == "f32")
            except _errors.InvalidArgument as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                if "beyond" not in e.message:
                    raise
                raise _errors.RangeError("%s: %s is out of %s range"
                                         % (what, _num_text(v), k)) from None
        elif k == "tensor":
            v = _integer(what, v)
            if not -(1 << 63) <= v < 1 << 64:  # msgpack's ints; the daemon checks the rest
                # No input's index, as the daemon says of one it can read (EINVAL,
                # protocol.md), whatever its size.
                raise _errors.InvalidArgument("%s: tensor %s is not an input index"
                                              % (what, _num_text(v)))
        elif k in ("i32", "u32", "i64"):
            v = _integer(what, v)
            if not -(1 << 63) <= v < 1 << 64:  # msgpack's ints; the daemon checks the rest
                raise _errors.RangeError("%s: %s is out of %s range"
                                         % (what, _num_text(v), k))
        out.append({k: v})
    return out


def _nbytes(shape: Tuple[int, ...], dt: np.dtype,
            limits: Optional[Mapping[str, Any]] = None) -> int:
    """Bytes of an array of ``shape`` and ``dt``, by the daemon's rule for a tensor
    (protocol.md, Tensors), checked before anything is allocated: a rank above
    ``max_rank`` (of ``limits``), more elements than ``max_elements``, a dimension
    beyond int64, or a product of the dimensions with each 0 counted as 1, times the
    item size, beyond 2^63-1 bytes (``[2^62, 2^62, 0]`` too, which has no element and
    no numpy array can have) is ELIMIT."""
    lim = limits or {}
    rank = lim.get("max_rank")
    if isinstance(rank, int) and len(shape) > rank:
        raise _errors.LimitExceeded("shape %s: rank %d, more than the daemon's max_rank "
                                    "(%d)" % (shape, len(shape), rank))
    if any(d > (1 << 63) - 1 for d in shape):
        raise _errors.LimitExceeded("shape %s: a dimension beyond int64" % (shape,))
    span = dt.itemsize
    for d in shape:
        span *= max(d, 1)
    if span > (1 << 63) - 1:
        raise _errors.LimitExceeded("shape %s of %s: %d bytes with each 0 counted as 1, "
                                    "more than 2^63-1" % (shape, dt, span))
    n = math.prod(shape)
    most = lim.get("max_elements")
    if isinstance(most, int) and n > most:
        raise _errors.LimitExceeded("shape %s: %d elements, more than the daemon's "
                                    "max_elements (%d)" % (shape, n, most))
    return n * dt.itemsize


def _num_text(v: Any) -> str:
    """A number for an error message, as the daemon names the client's (protocol.md
    "Errors"): an int in full up to 128 bits; a larger int or a Fraction to 17
    significant digits (10**400 as "1e+400": str() of an int past 4300 digits raises
    ValueError); anything else as _kind says it."""
    try:
        if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
            n = int(v)
            if n.bit_length() <= 128:
                return str(n)
            d = decimal.Decimal(n)
        elif isinstance(v, fractions.Fraction):
            d = decimal.Decimal(v.numerator) / decimal.Decimal(v.denominator)
        else:
            return _kind(v)
        ctx = decimal.Context(prec=17, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
        return format(ctx.plus(d).normalize(ctx), "g")
    except Exception as e:  # noqa: BLE001 - a value that will not be said: its kind says enough
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return _kind(v)


def _dt_text(dt: np.dtype) -> str:
    """A dtype for a message: its protocol name (f32, bf16...) where it has one, so
    that dspk.bfloat16 never shows as numpy's structured [('bf16', '<u2')], else
    numpy's name."""
    try:
        return wire_name(dt)
    except Exception as e:  # noqa: BLE001 - one with no protocol name
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return str(dt)


_KERNEL_TENSORS_MAX = 4  # a task's inputs: 1 to 4 tensors (protocol.md, kernel)
_FIELD_NAME = re.compile(r":[^:]*:")  # a struct field's name in a buffer format


def _byte_view(what: str, data: Any, fix: str) -> memoryview:
    """``data`` (any bytes-like object: an object of the buffer protocol) as a
    memoryview, for bytes sent as they are (ping's ``data``, a kernel's ``source``).
    Not a bytes-like object: dspk.InvalidArgument.  A buffer of Python object
    references (a numpy array of dtype object, or of a structured dtype with such a
    field: a buffer format holding ``O``) is dspk.DtypeError, as an op's operand of
    dtype object is: its bytes are this process's memory addresses, not data."""
    try:
        view = memoryview(data)
    except TypeError as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        raise _errors.InvalidArgument("%s: expected a bytes-like object, got %s"
                                      % (what, _kind(data))) from None
    if "O" in _FIELD_NAME.sub("", view.format):
        raise _errors.DtypeError(
            "%s: a buffer of Python objects (format %r, such as a numpy array of dtype "
            "object), whose bytes are this process's memory addresses, not data: %s"
            % (what, view.format, fix))
    return view


def _kind(v: Any) -> str:
    """What v is, for a message: its type and, when short, its value."""
    try:
        r = repr(v)
    except Exception as e:  # noqa: BLE001 - a repr that fails: the type says enough
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        return type(v).__name__
    return "%s %s" % (type(v).__name__, r) if len(r) <= 40 else type(v).__name__


def _as_array(x: Any, what: str = "operand",
              limits: Optional[Mapping[str, Any]] = None) -> np.ndarray:
    """x as a C-contiguous little-endian numpy array of a dspk dtype.  More elements
    than the daemon's ``max_elements`` (of ``limits``) is LimitExceeded, checked before
    a copy is made (a broadcast view of 2^40 elements has 4 bytes of its own).  A
    DeviceArray where a numpy array is wanted (to_device) is InvalidArgument."""
    if isinstance(x, DeviceArray):
        raise _errors.InvalidArgument(
            "%s: a DeviceArray (its data is in a daemon buffer, not here): use its "
            ".numpy() for a numpy copy, or pass it to an op as it is" % what)
    # A ragged list, an object numpy cannot take, one whose __array__ raises, a
    # masked array or a numpy.matrix: InvalidArgument naming the operand.
    a = as_ndarray(x, what)
    if a.dtype.kind in "biu" and a.dtype.names is None:
        raise _errors.DtypeError("%s: dtype %s has no dspk equivalent (float32, float64, "
                                 "complex64, complex128, float16, dspk.bfloat16)"
                                 % (what, a.dtype))
    try:
        wire_name(a.dtype)
    except _errors.DtypeError as e:
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        raise _errors.DtypeError("%s: %s" % (what, e.message)) from None
    most = (limits or {}).get("max_elements")
    if isinstance(most, int) and a.size > most:
        raise _errors.LimitExceeded("%s: %d elements, more than the daemon's max_elements "
                                    "(%d)" % (what, a.size, most))
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return a


def _meta(x: Any, what: str) -> Tuple[Tuple[int, ...], np.dtype]:
    if isinstance(x, DeviceArray):
        return x.shape, x.dtype
    a = as_ndarray(x, what)
    return tuple(a.shape), a.dtype


def _result_meta(op: str, inputs: Sequence[Any], options: Mapping[str, Any]
                 ) -> Optional[Tuple[Tuple[int, ...], int]]:
    """(shape, item size) of the op's first result as the daemon computes it
    (protocol.md, the table of ops), or None: unknown (kernel), or operands and
    options the daemon refuses by the client's reading of those rules (then its
    own error says why: nothing here may stand in for it, out='s checks included)."""
    try:
        metas = [_meta(x, "input %d" % i) for i, x in enumerate(inputs)]
        (sa, da) = metas[0]
        names = [wire_name(d) for _, d in metas]
        if op == "gemm":
            if len(metas) not in (2, 3) or names[0] != names[1] or \
                    names[0] not in ("f32", "f64", "f16", "bf16"):
                return None  # the daemon's EDTYPE
            sb = metas[1][0]
            if len(sa) < 2 or len(sb) < 2:
                return None  # ESHAPE
            m = sa[-1] if options.get("trans_a") else sa[-2]
            ka = sa[-2] if options.get("trans_a") else sa[-1]
            kb = sb[-1] if options.get("trans_b") else sb[-2]
            n = sb[-2] if options.get("trans_b") else sb[-1]
            if ka != kb:
                return None  # ESHAPE
            batch = np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
            shape = tuple(batch) + (m, n)
            size = 8 if names[0] == "f64" else 4  # f16, bf16: f32
            if len(metas) == 3:
                if names[2] != ("f64" if size == 8 else "f32"):
                    return None  # C has the result's dtype, else EDTYPE
                if np.broadcast_shapes(tuple(metas[2][0]), shape) != shape:
                    return None  # C broadcasts to the result, else ESHAPE
            return shape, size
        if len(set(names)) != 1 or names[0] not in ("f32", "f64", "c64", "c128"):
            return None  # operands of two dtypes, or one the op lacks: EDTYPE
        if op == "fft":
            if len(metas) != 1 or not sa or sa[-1] == 0:
                return None  # a scalar, or length 0: ESHAPE
            if sa[-1] > (1 << 31) - 1 and all(sa):
                return None  # a row above 2^31-1 (a batch of none is empty): ESHAPE
            if da.kind == "c":
                return tuple(sa), da.itemsize
            if options.get("inverse"):
                return None  # inverse of a real X: EINVAL
            return tuple(sa[:-1]) + (sa[-1] // 2 + 1,), 2 * da.itemsize
        if op == "fir":
            ok = len(metas) == 2 and sa and len(metas[1][0]) == 1 and metas[1][0][0] > 0
            return (tuple(sa), da.itemsize) if ok else None
        if op == "map":
            fn = options.get("fn")
            two = fn in ("add", "sub", "mul", "axpy")
            if fn not in ("add", "sub", "mul", "axpy", "scale", "abs", "exp") or \
                    len(metas) != (2 if two else 1):
                return None  # the daemon's EINVAL
            if two and tuple(metas[1][0]) != tuple(sa):
                return None  # the daemon's ESHAPE
            half = fn == "abs" and da.kind == "c"
            return tuple(sa), da.itemsize // 2 if half else da.itemsize
        if op == "reduce":
            fn = options.get("fn", "sum")
            if len(metas) != 1 or fn not in ("sum", "max", "min", "mean") or \
                    (fn in ("max", "min") and da.kind == "c"):
                return None  # EINVAL, EDTYPE
            axes = options.get("axes")
            if axes is None:
                gone = set(range(len(sa)))
            else:
                axes = [int(a) for a in axes]
                if not axes or not all(-len(sa) <= a < len(sa) for a in axes):
                    return None  # the daemon's EINVAL
                gone = {a % len(sa) for a in axes}
                if len(gone) != len(axes):
                    return None
            if fn in ("max", "min") and any(sa[i] == 0 for i in gone):
                return None  # over an axis of length 0: ESHAPE
            return tuple(n for i, n in enumerate(sa) if i not in gone), da.itemsize
        if op == "contract":
            sub = options.get("subscripts")
            if len(metas) != 2 or not isinstance(sub, str) or len(sub.encode()) > 63:
                return None  # the daemon's EINVAL (subscripts: at most 63 bytes)
            sub = sub.replace(" ", "")
            if sub.count("->") != 1:
                return None
            ins, outs = sub.split("->")
            terms = ins.split(",")
            letters = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
            if len(terms) != 2 or not all(set(t) <= letters for t in terms + [outs]):
                return None  # an ellipsis, another character, one operand or three
            dims: Dict[str, int] = {}
            for labels, (shape, _) in zip(terms, metas):
                if len(labels) != len(shape) or len(set(labels)) != len(labels) or \
                        len(labels) > 8:
                    return None
                for c, n in zip(labels, shape):
                    if dims.setdefault(c, n) != n:
                        return None  # a label of two sizes: ESHAPE
            if len(set(outs)) != len(outs) or len(outs) > 8 or \
                    not all(c in dims for c in outs):
                return None
            return tuple(dims[c] for c in outs), da.itemsize
    except Exception as e:  # noqa: BLE001 - malformed operands: the daemon's error says why
        if from_signal_handler(e):
            raise  # the caller's, as it is
        return None
    return None


_STD = ("f32", "f64", "c64", "c128")
_MAP_INPUTS = {"add": 2, "sub": 2, "mul": 2, "scale": 1, "axpy": 2, "abs": 1, "exp": 1}


def _op_refusal(op: str, inputs: Sequence[Any], options: Mapping[str, Any],
                limits: Mapping[str, Any]) -> Optional[Error]:
    """The error the daemon's check of the op's operands (backends/op.c, infer_*)
    would give, in its class and its very words, so that an op it refuses is refused
    before any operand is sent or staged; None where it would take them, or where the
    client does not know (then the daemon decides, as before): operands that are no
    arrays, a rank or size its generic checks refuse, the contraction's subscripts."""
    try:
        metas = [_meta(x, "input %d" % i) for i, x in enumerate(inputs)]
        names = [wire_name(d) for _, d in metas]
    except Exception as e:  # noqa: BLE001 - the operand's own error comes later
        if from_signal_handler(e):
            raise
        return None
    most = limits.get("max_rank")
    most = min(8, most) if isinstance(most, int) else 8
    if any(len(sh) > most or _over_limit(tuple(sh), limits) for sh, _ in metas):
        return None
    for (sh, dt) in metas:
        span = dt.itemsize
        for n in sh:
            span *= max(n, 1)
        if span > (1 << 63) - 1:
            return None
    shapes = [tuple(int(n) for n in sh) for sh, _ in metas]
    E = _errors
    if op == "gemm" and len(metas) in (2, 3):
        ab = ("A", "B", "C")
        for i in range(2):
            if names[i] not in ("f32", "f64", "f16", "bf16"):
                return E.DtypeError("gemm: %s has dtype %s (supported: f32, f64, f16, bf16)"
                                    % (ab[i], names[i]))
        if names[0] != names[1]:
            return E.DtypeError("gemm: A has dtype %s but B has dtype %s (must be equal)"
                                % (names[0], names[1]))
        for i in range(2):
            if len(shapes[i]) < 2:
                return E.ShapeError("gemm: %s has rank %d, needs rank >= 2 (1-D vectors are "
                                    "not promoted: reshape to (1,K) or (K,1))"
                                    % (ab[i], len(shapes[i])))
        A, B = shapes[0], shapes[1]
        ra, rb = len(A), len(B)
        ta, tb = bool(options.get("trans_a")), bool(options.get("trans_b"))
        am, ak = (ra - 1, ra - 2) if ta else (ra - 2, ra - 1)
        bk, bn = (rb - 1, rb - 2) if tb else (rb - 2, rb - 1)
        if A[ak] != B[bk]:
            return E.ShapeError("gemm: A has K=%d (axis %d%s) but B has K=%d (axis %d%s)"
                                % (A[ak], ak, ", trans_a" if ta else "", B[bk], bk,
                                   ", trans_b" if tb else ""))
        odt = "f64" if names[0] == "f64" else "f32"
        ro = max(ra, rb)
        out: List[int] = []
        for i in range(ro - 2):
            ia, ib = i - (ro - ra), i - (ro - rb)
            da = A[ia] if ia >= 0 else 1
            db = B[ib] if ib >= 0 else 1
            if da != db and da != 1 and db != 1:
                return E.ShapeError("gemm: batch dimensions do not broadcast: A has %d (axis "
                                    "%d) but B has %d (axis %d)" % (da, ia, db, ib))
            out.append(db if da == 1 else da)
        out += [A[am], B[bn]]
        if len(metas) == 3:
            C = shapes[2]
            if names[2] != odt:
                return E.DtypeError("gemm: C has dtype %s but the output is %s (must be "
                                    "equal)" % (names[2], odt))
            if len(C) > ro:
                return E.ShapeError("gemm: C has rank %d, more than the output's rank %d"
                                    % (len(C), ro))
            for i, n in enumerate(C):
                io = i + (ro - len(C))
                if n != 1 and n != out[io]:
                    return E.ShapeError("gemm: C has %d (axis %d) but the output has %d "
                                        "(axis %d): C must broadcast to the output"
                                        % (n, i, out[io], io))
        return None
    if op == "fft" and len(metas) == 1:
        X = shapes[0]
        if names[0] not in _STD:
            return E.DtypeError("fft: X has dtype %s (supported: c64, c128, and f32, f64 for "
                                "rfft)" % names[0])
        if not X:
            return E.ShapeError("fft: X has rank 0, needs rank >= 1")
        last = len(X) - 1
        if X[last] < 1:
            return E.ShapeError("fft: X has length 0 along axis %d (the transform axis)"
                                % last)
        if X[last] > (1 << 31) - 1 and math.prod(X) > 0:
            return E.ShapeError("fft: X has length %d along axis %d, above 2^31-1"
                                % (X[last], last))
        if names[0] in ("f32", "f64") and options.get("inverse"):
            return E.InvalidArgument("fft: X is real (%s): the inverse transform needs "
                                     "complex input (real input gives rfft)" % names[0])
        return None
    if op == "fir" and len(metas) == 2:
        X, H = shapes
        if names[0] not in _STD:
            return E.DtypeError("fir: X has dtype %s (supported: f32, f64, c64, c128)"
                                % names[0])
        if names[1] != names[0]:
            return E.DtypeError("fir: H has dtype %s but X has dtype %s (must be equal)"
                                % (names[1], names[0]))
        if not X:
            return E.ShapeError("fir: X has rank 0, needs rank >= 1")
        if len(H) != 1:
            return E.ShapeError("fir: H has rank %d, must be 1-D (K,)" % len(H))
        if H[0] < 1:
            return E.ShapeError("fir: H has length 0 (axis 0), needs >= 1 tap")
        return None
    if op == "contract" and len(metas) == 2:
        if names[0] not in _STD:
            return E.DtypeError("contract: A has dtype %s (supported: f32, f64, c64, c128)"
                                % names[0])
        if names[1] != names[0]:
            return E.DtypeError("contract: A has dtype %s but B has dtype %s (must be "
                                "equal)" % (names[0], names[1]))
        return None  # the subscripts: the daemon's checks
    if op == "reduce" and len(metas) == 1:
        fn = options.get("fn", "sum")
        if fn not in ("sum", "max", "min", "mean"):
            return None  # the daemon's EINVAL
        if names[0] not in _STD:
            return E.DtypeError("reduce: X has dtype %s (supported: f32, f64, c64, c128)"
                                % names[0])
        if fn in ("max", "min") and names[0] not in ("f32", "f64"):
            return E.DtypeError("reduce: %s needs real X, X has dtype %s" % (fn, names[0]))
        return None  # the axes: the daemon's checks
    if op == "map":
        fn = options.get("fn")
        if fn not in _MAP_INPUTS:
            return None  # the daemon's EINVAL
        if len(metas) != _MAP_INPUTS[fn]:
            k = _MAP_INPUTS[fn]
            return E.InvalidArgument("map: %s takes %d input%s, got %d"
                                     % (fn, k, "" if k == 1 else "s", len(metas)))
        if names[0] not in _STD:
            return E.DtypeError("map: A has dtype %s (supported: f32, f64, c64, c128)"
                                % names[0])
        if len(metas) == 2:
            A, B = shapes
            if names[1] != names[0]:
                return E.DtypeError("map: %s: A has dtype %s but B has dtype %s (must be "
                                    "equal)" % (fn, names[0], names[1]))
            if len(B) != len(A):
                return E.ShapeError("map: %s: A has rank %d but B has rank %d (shapes must "
                                    "be equal)" % (fn, len(A), len(B)))
            for i, (na, nb) in enumerate(zip(A, B)):
                if na != nb:
                    return E.ShapeError("map: %s: A has %d (axis %d) but B has %d (axis %d)"
                                        % (fn, na, i, nb, i))
        return None
    return None


def _result_dtype(op: str, inputs: Sequence[Any], options: Mapping[str, Any]
                  ) -> Optional[np.dtype]:
    """The dtype of the op's first result as the daemon makes it (protocol.md, the
    table of ops), or None where _result_meta knows no result."""
    if _result_meta(op, inputs, options) is None:
        return None
    da = _meta(inputs[0], "input 0")[1]
    if op == "gemm":  # f16 and bf16 in, f32 out
        return np.dtype(np.float64 if da.itemsize == 8 and da.kind == "f" else np.float32)
    if op == "fft" and da.kind != "c":
        return np.dtype(np.complex64 if da.itemsize == 4 else np.complex128)
    if op == "map" and options.get("fn") == "abs" and da.kind == "c":
        return np.dtype(np.float32 if da.itemsize == 8 else np.float64)
    return np.dtype(da.newbyteorder("<") if da.byteorder == ">" else da)


def _result_bound(op: str, inputs: Sequence[Any], options: Mapping[str, Any],
                  limits: Mapping[str, Any]) -> Optional[int]:
    """The bytes of the op's one result (None: unknown, or an error the daemon will
    name: a result of more than max_elements elements is the daemon's ELIMIT, before
    any buffer is made for it)."""
    meta = _result_meta(op, inputs, options)
    if meta is None or _over_limit(meta[0], limits):
        return None
    return math.prod(meta[0]) * meta[1]


def _over_limit(shape: Tuple[int, ...], limits: Mapping[str, Any]) -> bool:
    """Whether a result of ``shape`` is the daemon's ELIMIT (max_elements, or a size
    beyond 2^63-1 bytes)."""
    n = math.prod(shape)
    most = limits.get("max_elements")
    return (isinstance(most, int) and n > most) or n * 16 > (1 << 63) - 1


def _sendable(text: str) -> str:
    """An OS-provided string (a file name: sys.argv[0]) as UTF-8 text: its bytes (the
    surrogate escapes of bytes that are no UTF-8 given back as those bytes), each one
    that is not part of a well-formed UTF-8 character replaced by U+FFFD, as the daemon
    does for client strings (protocol.md).  Never raises."""
    try:
        raw = os.fsencode(text)
    except UnicodeError as e:  # a surrogate no decoding made (from a caller's str)
        if from_signal_handler(e):
            raise  # a signal handler's: the caller's, as it is
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


def _check_timeout(timeout: Any) -> Optional[float]:
    """A client's timeout as connect() takes it (and ``c.timeout = ...``): None, or a
    number of seconds more than 0 (one beyond any wait: None)."""
    if isinstance(timeout, numbers.Integral) and not isinstance(timeout, (bool, np.bool_)) \
            and timeout > _TIMEOUT_FOREVER:  # 10**400 too, which no float holds
        return None
    if timeout is not None:
        timeout = _number("timeout", timeout)
        if not timeout > 0:  # NaN too: no call could ever be answered
            raise _errors.InvalidArgument("timeout: %r seconds (want more than 0, or "
                                          "None to wait for ever)" % timeout)
        if timeout > _TIMEOUT_FOREVER:  # inf too: no wait can take it
            return None
    return timeout


def _job_id(v: str) -> int:
    """``v`` as a Slurm job id (a decimal number from 1 to 2^64-1 without leading zeros,
    signs or blanks: hello's job is a uint64), else 0."""
    if not (v.isascii() and v.isdigit() and not v.startswith("0")):
        return 0
    job = int(v)
    return job if job < 1 << 64 else 0


def _env_job() -> int:
    """The Slurm job this process runs in, which hello tells the daemon so that it
    enforces the job's GPU allocation: $DSPK_JOB, else $SLURM_JOB_ID (0: none).  A
    $DSPK_JOB that is set, not empty and no job id is dspk.InvalidArgument, as
    libdspkclient's EINVAL (it was ignored: the client then ran outside the job it
    named); a malformed $SLURM_JOB_ID names no job."""
    v = os.environ.get("DSPK_JOB") or ""
    if v:
        job = _job_id(v)
        if not job:
            # repr(), as the other messages show text: printable characters as they
            # are, others (the surrogate escape of a byte that is no UTF-8) escaped
            # once (the backslashes of an ASCII escaping were escaped again by %r).
            shown = v[:40]
            raise _errors.InvalidArgument(
                "$DSPK_JOB %r%s is not a Slurm job id (a decimal number from 1 to "
                "18446744073709551615, without leading zeros, signs or blanks); unset it, "
                "or set it empty, for $SLURM_JOB_ID's" % (shown, "..." if len(v) > 40 else ""))
        return job
    return _job_id(os.environ.get("SLURM_JOB_ID") or "")

class Client:
    """A connection to dspkd (see :func:`connect`).  Thread-safe: any number of threads
    may call it at once; each call waits only for its own answer.  Callbacks (a
    future's done-callbacks, ``progress``) run in order on the client's
    ``dspk-callbacks`` thread, never on the thread reading the connection."""

    def __init__(self, socket: Optional[SocketPath] = None, *,
                 name: Optional[str] = None, timeout: Optional[Real] = None) -> None:
        if socket is not None and not isinstance(socket, (str, bytes, os.PathLike)):
            raise _errors.InvalidArgument("socket: expected a path, got %s" % _kind(socket))
        if socket is not None and not isinstance(socket, (str, bytes)):
            # A path object's __fspath__ may give neither str nor bytes, or raise: the
            # caller's argument of another type, refused as such before connecting.
            try:
                socket = os.fspath(socket)
            except Exception as e:  # noqa: BLE001 - what the object raises: named
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                raise _errors.InvalidArgument(
                    "socket: expected a path, got %s whose __fspath__() gives no str "
                    "or bytes (%s)" % (_kind(socket), _errors._describe(e))) from None
        self._socket_path = os.fsdecode(socket) if socket is not None else default_socket()
        if not self._socket_path:
            raise _errors.ConnectError("cannot connect to dspkd: the socket path is empty "
                                       "(socket=None takes the default, "
                                       "dspk.default_socket())")
        if "\0" in self._socket_path:
            # The kernel would take the path up to its first NUL (and one that starts
            # with a NUL names an abstract socket): another socket than the one meant.
            raise _errors.InvalidArgument("socket: the path %r holds a NUL character"
                                          % self._socket_path)
        timeout = _check_timeout(timeout)
        if name is not None:
            _string("name", name)
            if "\0" in name:  # the daemon's status would show the name cut there
                raise _errors.InvalidArgument("name: %r holds a NUL character" % name)
            try:
                name.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 for the daemon
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                raise _errors.InvalidArgument("name: not valid Unicode text (%s)"
                                              % e.reason) from None
        self._timeout: Optional[float] = timeout
        self._env_job = _env_job()  # before connecting: a malformed $DSPK_JOB is the caller's
        too_long = _socket_path_error(self._socket_path, socket is not None)
        if too_long is not None:
            raise too_long
        # "@name": the abstract socket name (a leading '@', as systemd's
        # ListenStream=@name and ss print it; the same rule as libdspkclient's).
        self._address = _address(self._socket_path)
        # Every descriptor made here is held by an object that closes it when collected
        # (the socket, the wake-up socket pair below): one that an interruption drops
        # before it is stored is closed with it.  Whatever fails or is interrupted (a
        # signal handler's KeyboardInterrupt too) after the socket is made closes the
        # socket and the wake-up pair before connect() raises (_abandon): the caller
        # gets no Client to close.
        try:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        except OSError as e:
            if _foreign(e):
                raise  # a signal handler's: the caller's
            # out of descriptors (EMFILE, ENFILE): LimitExceeded, as for the pair below
            raise _os_error("the client's socket", e) from None
        made = False
        try:
            self._init_connected(sock, name)
            made = True
        finally:
            if not made:
                self._abandon(sock)

    def _init_connected(self, sock: _socket.socket, name: Optional[str]) -> None:
        """The rest of __init__, once the socket is made: connects, makes the wake-up
        pair and the client's state, says hello.  Its caller releases everything it
        made when it raises."""
        timeout = self.timeout
        try:
            if timeout is None:
                sock.connect(self._address)
            else:
                self._connect_before(sock, time.monotonic() + timeout)
        except BaseException as e:
            sock.close()
            if _foreign(e) or not isinstance(e, OSError):
                raise  # a signal handler's exception (KeyboardInterrupt...): the caller's
            if isinstance(e, TimeoutError):
                raise _errors.Timeout("cannot connect to dspkd at %s within %gs (it accepts "
                                      "no connections)" % (self._socket_path, timeout)) \
                    from None
            if _is_abstract(self._socket_path):
                raise _errors.ConnectError(
                    "cannot connect to dspkd at %s: %s (an abstract socket: a leading '@' "
                    "names the abstract namespace)"
                    % (self._socket_path,
                       "no daemon listens on this abstract name"
                       if isinstance(e, ConnectionRefusedError) else e.strerror or e)) \
                    from None
            raise _errors.ConnectError("cannot connect to dspkd at %s: %s%s"
                                       % (self._socket_path, e.strerror or e,
                                          _not_a_socket(self._socket_path))) from None
        self._sock = sock
        # The process that connected: a child of fork() shares the socket and the
        # daemon's buffers with it, and must touch neither (_forked).
        self._pid = os.getpid()
        self._forks = _FORKS[0]
        self._wself = weakref.ref(self)  # each future's _owner
        # close() wakes a thread waiting to send (the daemon reads no more) by writing
        # to this socket pair, whose other end that wait watches with the socket:
        # shutdown() does not wake a wait for room to write.  A socket pair, not a
        # pipe: its descriptors are owned by objects that close them when collected,
        # so that none leaks when an interruption comes right after they are made.
        try:
            self._wake_pair = _socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        except OSError as e:
            if _foreign(e):
                raise  # a signal handler's: the caller's
            raise _os_error("the client's wake-up socket pair", e) from None
        for end in self._wake_pair:
            end.setblocking(False)  # a wake-up that finds it full is one already
        self._wake_r = self._wake_pair[0].fileno()  # polled by a wait to send
        # Waiting for an answer: poll() on one registered descriptor costs less per
        # call than select.select() or a non-blocking recv that fails first.
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        # The reading's state, each step recorded by C code with the step itself
        # (_read_once): (token, buffer, count) of each receive into _rbuf (the last
        # counts), the position filed (_RState, the last counts), a token stored as
        # each recv_into starts, and the messages decoded and their completions, in
        # order, not yet run.
        self._rbuf = bytearray(_READ_CHUNK)
        self._held: List[Tuple[Any, bytearray, int]] = []
        self._rlog: List[_RState] = [_RState(None, 0, 0, None, _new_unpacker())]
        self._rcalls: List[Any] = []
        self._inbox: List[Any] = []
        # buffer.read answers received straight into their destination:
        # msgid -> (the answer frame's first bytes up to its data, destination)
        self._direct: Dict[int, Tuple[bytes, memoryview]] = {}
        self._lock = threading.RLock()  # an RLock: _wait_in takes it back safely
        self._cond = threading.Condition(self._lock)
        self._send_lock = _SendLock()
        self._pending: Dict[int, _Call] = {}
        self._next_id = 1
        self._reading = False            # some thread is in the pump
        self._reader_ident = 0           # ...this one
        self._async = 0                  # pending submit() futures
        self._thread: Optional[_Runner] = None  # the reader's (see _ensure_reader)
        self._closed: Optional[Error] = None   # set once the connection is unusable
        self._protocol_error: Optional[Error] = None
        try:
            self._nonce = os.urandom(16)
        except OSError as e:  # no getrandom(), and /dev/urandom cannot be opened
            if _foreign(e):
                raise  # a signal handler's: the caller's
            raise _os_error("the client's random nonce", e) from None
        # Shared arrays of empty_shared(): buffer id -> (address, bytes, device).
        self._shared: Dict[int, Tuple[int, int, str]] = {}
        # buffer.free owed: collected shared arrays, buffers answered after a Timeout,
        # temporaries; sent with msgid 0 (answers to it are dropped) by _flush_frees.
        # Entries: a buffer id, or the _SharedRef of a collected shared array.
        self._dead_shared: List[Any] = []
        # The _Lent references of results collected (their callback, C code, appends
        # them): their temporaries are taken back at the next request (_start).  A
        # hint only: _temp_reclaim_locked finds them without it.
        self._lent_back: List[Any] = []
        # The futures of buffer.create/buffer.import calls whose caller stopped
        # waiting (an interruption, a Timeout): each one's buffer, once answered, is
        # owed a free.  Kept here, and looked at by _flush_frees_locked, so that the
        # free never hangs on a done-callback that an interruption can cut as it
        # starts (_orphaned_buffer is only the quick path).
        self._orphans: List[TaskFuture] = []
        # The _ClaimRef of each buffer being made (kept so that its callback runs as its
        # _Claim is collected), and those whose claim was collected (looked at by
        # _take_orphans: the buffer of one not handed over is an orphan's).
        self._claims: Set[_ClaimRef] = set()
        self._dead_claims: List[_ClaimRef] = []
        # The _SharedRef of each shared array (buffer id -> it): kept here so that its
        # callback runs when the array is collected.
        self._shared_refs: Dict[int, _SharedRef] = {}
        # The automatic shared-memory path (libdspkclient's): inline operands and
        # results of at least shared_threshold bytes on cpu:0 go through reused
        # shared temporaries instead of the socket.
        self._shared_threshold = _env_threshold()
        self._temps: List[_Temp] = []
        self._temp_clock = 0
        self._temp_lock = threading.Lock()
        self._any_is_cpu: Optional[bool] = None
        self._any_asking = False         # a devices call of submit() is in flight
        # The daemon's devices, from the first devices answer of the connection (a
        # daemon's devices do not change while it runs): the staging of operands on
        # "any" picks its device by them without a round trip each time.
        self._devs: Optional[List[Dict[str, Any]]] = None
        # submit()s that would wait for an answer before their task can be sent (a
        # staged operand, a large result's temporary buffer): run in order by one
        # worker thread, started when needed and gone when it has nothing to do.
        # Taken by ``with self._work_lock`` (C code: no interruption between taking it
        # and the block), never ``with self._work_cond`` (Condition.__enter__ is Python
        # code, where one could leave the lock held, the worker then blocked for ever).
        self._work_lock = threading.RLock()  # an RLock: see _wait_in
        self._work_cond = threading.Condition(self._work_lock)
        # The jobs queued: submit() appends one in a single C call (deque.append), so
        # that an interruption never leaves a job queued but uncounted, or counted but
        # not queued (a separate count raised after the append was cut there: the
        # job was later run and the count went below 0, and every call then waited
        # for "the submit()s made before it" for ever).
        self._jobs: "collections.deque[_Job]" = collections.deque()
        # Jobs taken by the worker whose task is not sent yet: changed by the worker's
        # thread only (no signal handler runs there), under _work_lock.
        self._jobs_running = 0
        # The worker's token (_Runner): set while one runs or is launched.  Whoever
        # finds jobs queued and none (an interruption cut a launch) launches one
        # (_ensure_worker_locked: submit(), the calls that wait for the jobs, result()).
        self._worker: Optional[_Runner] = None
        self._tl = threading.local()     # .deferring: in submit()'s first attempt
        # The user's callbacks (done-callbacks, progress calls) run in order on one
        # thread of their own, started when one is queued and gone when none is: never
        # on the thread reading the connection, which a callback that calls the client
        # and waits (or waits for another thread that does) would otherwise stop.
        self._cb_lock = threading.Lock()  # taken by with, as _work_lock
        self._cb_cond = threading.Condition(self._cb_lock)
        self._cb_queue: "collections.deque[Tuple[Callable[..., Any], Tuple[Any, ...]]]" = \
            collections.deque()
        # The callbacks thread's token (_Runner): set while one runs or is launched.
        self._cb_thread: Optional[_Runner] = None
        # Progress calls queued per future (by id): its settle waits behind them, so
        # that progress is always called before the future completes.
        self._cb_progress: Dict[int, int] = {}
        self._limits: Dict[str, int] = {}
        if name is None:
            argv = getattr(sys, "argv", None)  # absent in an embedded interpreter
            name = "python:" + _sendable(os.path.basename(
                argv[0] if isinstance(argv, list) and argv and isinstance(argv[0], str)
                and argv[0] else "python"))
        raw = name.encode("utf-8")[:63]
        name = raw.decode("utf-8", "ignore")
        params: Dict[str, Any] = {"version": 1, "client": name}
        job = self._env_job
        if job:
            params["job"] = job     # the Slurm job this process runs in
        try:
            hello = self._call("hello", params, _decode_hello)  # failing: _abandon
        except Error as e:
            if _foreign(e):
                raise  # a signal handler's: the caller's
            # Named as connect()'s (a Timeout of a stopped daemon, a malformed answer),
            # the socket too.
            raise _errors.error_from({
                "code": e.code, "name": e.name,
                "message": ("connect(): " if self._socket_path in e.message else
                            "connect() to dspkd at %s: " % self._socket_path)
                + e.message}) from None
        self._name = name
        self._daemon_version: str = hello[0]
        self._client_id: int = hello[1]
        self._limits = hello[2]

    def _abandon(self, sock: _socket.socket) -> None:
        """__init__ failed or was interrupted after the socket was made: closes the
        socket and the wake-up pair (whatever of them was made), taking no lock and
        waiting for nothing.  No other thread uses the client yet (hello is read on
        the constructing thread; no reader or worker thread is started before it)."""
        self._closed = _errors.Closed("connect() failed")  # __del__: nothing to close
        try:
            sock.close()
        finally:
            self._close_wake()

    def _connect_before(self, sock: _socket.socket, deadline: float) -> None:
        """connect() that gives up at ``deadline`` (TimeoutError).  A full listen
        backlog (a daemon that accepts no more) blocks a blocking connect() for ever;
        a non-blocking one on a Unix socket fails with EAGAIN at once and can only be
        tried again (there is nothing to poll for), a little later each time."""
        sock.setblocking(False)
        pause = 0.001
        while True:
            try:
                sock.connect(self._address)
                break
            except (BlockingIOError, InterruptedError) as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError() from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.05)
        sock.setblocking(True)

    # ---- connection --------------------------------------------------------------

    @_public
    def close(self) -> None:
        """Closes the connection (idempotent).  Pending calls end with dspk.Closed; the
        daemon frees this connection's buffers and drops its queued tasks.  Returns at
        once whatever other threads do: it never waits for the send lock (a thread
        writing, or waiting for room or for the lock, is woken with dspk.Closed; the
        descriptor is closed when the last writer lets go).  In a child
        of fork() it closes only the child's copy of the descriptor (the connection,
        and its buffers, stay the parent's)."""
        if self._forked():
            self._close_forked()
            return
        with self._lock:
            already = self._closed is not None
            if not already:
                self._closed = _errors.Closed("connection closed by the client")
        if not already:
            try:
                self._sock.shutdown(_socket.SHUT_RDWR)
            except OSError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass
            self._wake()
        self._fail_all()
        self._fail_jobs()
        self._drop_temps_closed()
        self._send_lock.wake()  # a thread waiting to send sees the client closed
        t = self._thread
        if t is not None and t.ident != _thread.get_ident():
            with self._lock:  # until the reader has ended (it sees the client closed)
                while self._thread is t:
                    _wait_in(self._cond, _SEND_RECHECK)
        self._release_fds()

    def _release_fds(self) -> None:
        """Once closed: closes the socket's and the wake-up pair's descriptors when no
        thread writes (a writer still polls them; the one that gives the send lock
        back after close() calls this again) and none reads.  Never waits for a lock
        held for longer than a few instructions: close() returns at once whatever
        other threads do."""
        sl = self._send_lock
        # Under the send lock's mutex only (held for a few instructions, re-entrant,
        # and taking no other lock inside): this runs when a writer lets go, maybe
        # in a garbage collection on a thread that holds _lock.  _closed is set, so a
        # thread that starts reading or writing now sees it before it touches the
        # socket; one that reads already is seen in _reading.
        with sl.mutex:
            if sl.owner is not None:
                return  # that writer calls this when it lets go
            if self._sock.fileno() >= 0 and not self._reading:
                try:
                    self._sock.close()
                except OSError as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's: the caller's, as it is
                    pass  # the descriptor is gone either way (close(2) frees it)
            self._close_wake()

    def _wake(self) -> None:
        """Wakes a thread waiting for room to send (it then sees the client closed)."""
        try:
            self._wake_pair[1].send(b"\0")
        except OSError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass  # full (it is awake already) or closed

    def _close_wake(self) -> None:
        self._wake_r = -1
        for end in getattr(self, "_wake_pair", ()):
            try:
                end.close()
            except OSError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass  # the descriptor is gone either way (close(2) frees it)

    def _forked(self) -> bool:
        """Whether this is a child process of fork() of the process that connected."""
        return _FORKS[0] != self._forks or os.getpid() != self._pid

    def _fork_error(self) -> Error:
        return _errors.Closed("this client belongs to process %d, and this process (%d) "
                              "is a child of fork(): connect anew in the child"
                              % (self._pid, os.getpid()))

    def _close_forked(self) -> None:
        """close() in a child of fork(): the child's copies of the descriptors are
        closed, without shutdown() (which would end the parent's connection) and
        without taking a lock (another thread of the parent may have held it at the
        fork, and no thread of the child will ever let it go)."""
        if self._closed is None:
            self._closed = self._fork_error()
        del self._dead_shared[:]  # the same list: finalizers append to it
        del self._lent_back[:]
        del self._orphans[:]
        del self._dead_claims[:]
        try:
            self._sock.close()  # close(2) of this process's descriptor only
        except OSError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass
        self._close_wake()

    def __enter__(self) -> "Client":
        return self

    def __repr__(self) -> str:
        return "Client(socket=%r, client_id=%r%s)" % (
            getattr(self, "_socket_path", None), getattr(self, "_client_id", None),
            ", closed" if getattr(self, "_closed", None) is not None else "")

    def __reduce_ex__(self, protocol: Any) -> Any:
        """pickle and copy: TypeError (a connection cannot be copied: connect anew)."""
        raise TypeError("cannot pickle or copy a dspk.Client (a connection of this "
                        "process): connect anew where it is needed")

    @_untraced
    def __exit__(self, *exc: Any) -> None:
        self.close()

    @_untraced
    def __del__(self) -> None:
        try:
            if getattr(self, "_closed", True) is None or \
                    (getattr(self, "_pid", None) not in (None, os.getpid()) and
                     self._sock.fileno() >= 0):
                self.close()
        except Exception:
            pass

    @property
    def socket_path(self) -> str:
        """The path of the daemon's socket this client connected to, as a str
        (os.fsdecode of a bytes path; read-only)."""
        return self._socket_path

    @property
    def closed(self) -> bool:
        """Whether the connection is closed: close(), a lost connection, or a child of
        fork() (read-only)."""
        return self._closed is not None or self._forked()

    @property
    def timeout(self) -> Optional[float]:
        """Seconds any one call may wait (None: for ever).  Settable: a value is
        checked as connect() checks it (dspk.InvalidArgument)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: Optional[Real]) -> None:
        self._timeout = _check_timeout(value)

    @property
    def shared_threshold(self) -> int:
        """Bytes from which a plain numpy operand or result goes through a shared
        temporary (0: never).  Settable: an integer of 0 or more (dspk.InvalidArgument
        otherwise)."""
        return self._shared_threshold

    @shared_threshold.setter
    def shared_threshold(self, value: Integral) -> None:
        v = _integer("shared_threshold", value)
        if v < 0:
            raise _errors.InvalidArgument("shared_threshold: %d bytes (want 0 or more; "
                                          "0: never)" % v)
        self._shared_threshold = v

    @property
    def name(self) -> Optional[str]:
        """The name given to connect() (read-only)."""
        return self._name

    @property
    def daemon_version(self) -> str:
        """The daemon's version, from its hello (read-only)."""
        return self._daemon_version

    @property
    def client_id(self) -> int:
        """This connection's id in the daemon, from its hello (read-only)."""
        return self._client_id

    @property
    def limits(self) -> Mapping[str, int]:
        """The daemon's limits from its ``hello`` answer (protocol.md), read-only: the
        client goes by them, so they are not the caller's to change."""
        return types.MappingProxyType(self._limits)

    @property
    def max_message(self) -> int:
        """The daemon's ``max_message`` (``c.limits["max_message"]``, from ``hello``):
        the largest message, in bytes, either end may send on this connection; the
        client stages larger operands and results through temporary buffers, and
        writes and reads buffers in chunks below it."""
        return int(self._limits.get("max_message", _DEFAULT_MAX_MESSAGE))

    # ---- wire --------------------------------------------------------------------

    def _encode(self, msg: List[Any], bigs: List[memoryview]) -> List[Any]:
        """The message as a list of byte chunks; each payload in ``bigs`` (already in
        ``msg`` as a placeholder ExtType) is spliced in as a bin32 without a copy."""
        tl = _PACKERS.__dict__
        packer = tl.get("p")
        if packer is None:
            packer = tl["p"] = msgpack.Packer(use_bin_type=True)
        try:
            # One Packer per thread, kept (msgpack.packb makes one, with its 1 MiB
            # buffer, on every call); pack() empties it on an error and after each
            # message (autoreset).
            packed = packer.pack(msg)
            if len(packed) > _PACKER_KEEP:
                del tl["p"]  # its buffer grew to this message's size, and keeps it
        except (OverflowError, TypeError, ValueError) as e:
            # A value msgpack cannot carry (an int beyond 64 bits, an object): the
            # caller's argument, refused before anything is sent.
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            raise _errors.InvalidArgument("%s: an argument cannot be sent: %s"
                                          % (msg[2], e)) from None
        if not bigs:
            return [packed]
        chunks: List[Any] = []
        pos = 0
        for i, view in enumerate(bigs):
            tag = self._nonce + i.to_bytes(4, "little")
            ext = msgpack.packb(msgpack.ExtType(1, tag))
            at = packed.find(ext, pos)
            assert at >= 0
            chunks.append(packed[pos:at])
            chunks.append(b"\xc6" + view.nbytes.to_bytes(4, "big"))
            chunks.append(view)
            pos = at + len(ext)
        chunks.append(packed[pos:])
        return chunks

    def _bin(self, data: Any, bigs: List[memoryview]) -> Any:
        """``data`` for a request: small as bytes, large as a placeholder spliced in by
        _encode."""
        view = memoryview(data).cast("B")
        if view.nbytes < _BIG:
            return view.tobytes()
        bigs.append(view)
        return msgpack.ExtType(1, self._nonce + (len(bigs) - 1).to_bytes(4, "little"))

    def _send_chunks(self, chunks: List[Any], fds: Optional[List[int]] = None,
                     mark: Optional[TaskFuture] = None, deadline: Any = _EACH) -> None:
        """Writes one message (its chunks in order, ``fds`` with its first byte) under
        the send lock, then the buffer.free owed.  The socket is written without
        blocking and waited on with poll(), so that an exception raised while waiting
        (KeyboardInterrupt from a signal handler) is known to have cut nothing."""
        if len(chunks) == 1 and type(chunks[0]) is bytes:  # a message msgpack packed
            views = [memoryview(chunks[0])] if chunks[0] else []
        else:
            views = [v for v in (memoryview(c).cast("B") for c in chunks) if v.nbytes]
        # File descriptors go with the first sendmsg of this message only, whose data
        # starts with its frame: every earlier message was written whole under the send
        # lock, so nothing of another frame precedes it in that call (protocol.md,
        # Passing descriptors: the kernel gives them to the first part of a call's data).
        anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _array.array("i", fds))] \
            if fds else []
        # The timeout bounds sending too: a daemon that stopped reading (SIGSTOP, a
        # hung host) fills the socket's buffer, and a blocking send, or the send lock
        # another thread holds meanwhile, would wait for ever.
        if deadline is _EACH:
            timeout = self._timeout
            deadline = None if timeout is None else time.monotonic() + timeout
        # submit() waits for nothing, the socket included (docs/python.md, Futures):
        # while another thread holds the right to send, the op goes to the worker
        # (_Defer: nothing of it was sent), and what the socket does not take at once
        # is handed, with the right to send, to a writer thread (_hand_off), whose
        # failure (a timeout, a lost connection) ends the future.
        handoff = mark is not None and getattr(self._tl, "deferring", False)
        sl, token = self._send_lock, object()
        handed: List[int] = []  # the writer thread's ident once it was started
        try:
            if handoff:
                if not sl.claim(token, None, wait=False, gone=self._gone):
                    raise _Defer()
            else:
                try:
                    with sl.mutex:  # (claim()'s case of a free right, without the call)
                        if sl.owner is None:
                            sl.owner = token
                    if sl.owner is not token:
                        sl.claim(token, deadline, gone=self._gone)
                except _SendWaitTimeout:
                    raise _errors.Timeout("%s: could not send the request within %gs "
                                          "(the daemon reads no more)" % (
                                              self._request_at(mark), self.timeout)
                                          ) from None
            if self._closed is not None:
                raise self._closed_error()
            # The frees owed first (shared arrays collected since the last request):
            # the daemon has them before this request's answer.
            if self._dead_shared or self._orphans or self._dead_claims:
                self._flush_frees_locked()
            try:
                self._write_locked(views, anc, deadline, mark=mark, handoff=handoff)
            except _HandOff as h:
                self._hand_off(token, h, deadline, mark, handed)
                if handed:
                    return  # the writer thread gives the right to send back
            if self._dead_shared or self._orphans or self._dead_claims:
                self._flush_frees_locked()
        finally:
            if sl.owner is token and not handed:  # no call before the store
                sl.owner = None
                self._after_send()
        if self._dead_shared or self._dead_claims:  # queued while this thread held the lock
            self._flush_frees()

    def _hand_off(self, token: Any, h: _HandOff, deadline: Optional[float],
                  mark: Any, handed: List[int]) -> None:
        """submit()'s request, of which the socket took ``h.sent`` bytes without waiting:
        its rest goes to a new writer thread, which holds the right to send (``token``)
        until the message is written whole; ``handed`` gets the thread's ident (stored
        by C code, so that an interruption after the start still finds it).  The rest
        is copied first where it lies in the caller's memory (a numpy operand), which
        the caller may write once submit() returns.  Where no thread can be had, the
        rest is written here, waiting as a synchronous call does."""
        try:
            rest = [v if isinstance(v.obj, bytes) else memoryview(bytes(v))
                    for v in h.views]
            mark._handed = True
            # (in a list the thread empties: the arguments tuple, held by the
            # thread until its function has returned, holds nothing of the request)
            handed.extend(map(_thread.start_new_thread, (self._writer_main,),
                              (([token, rest, h.anc, h.sent, deadline, mark],),)))
        except RuntimeError as e:  # _thread: "can't start new thread"
            if _foreign(e) or handed:
                raise
            mark._handed = False
            self._write_locked(h.views, h.anc, deadline, h.sent, mark)
        except BaseException as e:  # an interruption (or no memory for the copy)
            if not handed and h.sent:  # the stream is inside the message: cut it
                self._cut(_errors.Closed(
                    "a request was cut after %d bytes by %s; the connection is closed"
                    % (h.sent, type(e).__name__)))
            raise

    def _writer_main(self, job: List[Any]) -> None:
        """The writer thread of one submit() (_hand_off), ``job`` [token, views, anc,
        sent, deadline, mark] (emptied as it starts): writes the rest of its request,
        waiting for room at most until ``deadline``, then gives the right to send
        back.  A failure ends the future (dspk.Timeout, the connection closed when
        part of the request went; dspk.Closed when it is gone).  Its future and the
        views of the request are let go before the thread ends (probe 22 C2)."""
        token, views, anc, sent, deadline, mark = job
        job.clear()
        sl = self._send_lock
        try:
            try:
                self._write_locked(views, anc, deadline, sent, mark)
                self._flush_frees_locked()
                views = mark = None  # type: ignore[assignment]
            except BaseException as e:  # noqa: B036 - the future's, on this thread
                err = _as_error(e)
                if not isinstance(err, Error):
                    err = _errors.IOFailure("sending %s: %s" % (
                        self._request_at(mark), _errors._describe(e)))
                self._fail_call(mark, err)
                err = mark = views = None  # see _no_cycle
        finally:
            if sl.owner is token:  # no call before the store
                sl.owner = None
                self._after_send()
        if self._dead_shared or self._dead_claims:
            self._flush_frees()

    def _fail_call(self, fut: TaskFuture, err: BaseException) -> None:
        """Ends a pending request's future with ``err`` (its request was not sent
        whole: no answer will come)."""
        with self._lock:
            call = self._pending.get(fut._msgid)
            if call is not None and call.future is fut:
                del self._pending[fut._msgid]
                self._direct.pop(fut._msgid, None)
                if call.is_async:
                    self._async -= 1
                self._cond.notify_all()
        self._settle(fut, exc=err)

    def _gone(self) -> Optional[BaseException]:
        """For _SendLock.claim: the error of a closed client, else None."""
        return self._closed_error() if self._closed is not None else None

    def _after_send(self) -> None:
        """The send lock was given back: wakes the threads waiting for it, and closes
        the descriptors if close() came meanwhile."""
        self._send_lock.wake()
        if self._closed is not None and not self._forked():
            self._release_fds()

    def _write_locked(self, views: List[memoryview], anc: List[Any],
                      deadline: Optional[float], sent: int = 0,
                      mark: Optional[TaskFuture] = None, handoff: bool = False) -> None:
        """Writes ``views`` whole (the caller holds the send lock; ``sent``: bytes of the
        message already written).  A message cut on the wire leaves a stream that can
        carry no other, so the connection is closed (later calls: dspk.Closed) when
        the timeout runs out (dspk.Timeout) or any exception (KeyboardInterrupt) is
        raised after part of it was written; one raised before the first byte went,
        or after the last, leaves the connection usable.  With ``handoff`` (submit()),
        _HandOff where it would wait for room."""
        total = sent + (views[0].nbytes if len(views) == 1 else
                        sum(v.nbytes for v in views))
        # What each sendmsg returned, appended by C code (list.extend of a map calls
        # sendmsg and stores its count without returning to Python code in between):
        # a signal handler runs only once the count is stored, so the bytes sent are
        # always ``base + sum(counts)``, wherever an interruption lands.  ``starts``
        # gets an entry as each call starts, stored by C code in the same chain
        # (_then: nothing runs between it and the call): more starts than counts
        # means an exception came out of a call itself, whose bytes are unknown
        # (``ours`` is the exception the socket raised, caught below: one that
        # comes while it is handled came from no call).
        base = sent
        counts: List[int] = []
        starts: List[None] = []
        ours: Optional[BaseException] = None
        send = self._sock.sendmsg
        try:
            while views:
                ours = None
                try:
                    counts.extend(map(send, map(_SECOND, zip(map(starts.append, (None,)),
                                                             (views[:512],))),
                                      (anc,), (_socket.MSG_DONTWAIT,)))
                    n = counts[-1]
                except (BlockingIOError, InterruptedError) as e:
                    ours = e  # (first: no call before it)
                    if _foreign(e):
                        raise  # a signal handler's, out of the call: bytes unknown
                    counts.append(0)  # the socket's own: nothing sent
                    n = -1
                except OSError as e:
                    ours = e
                    if _foreign(e):
                        raise  # a signal handler's TimeoutError...: not a lost socket
                    raise _LostWhileSending(e) from None
                if n < 0:
                    if handoff:
                        raise _HandOff(views, anc, sent)
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        self._send_timed_out(sent, mark)
                    # poll(), not select(): no FD_SETSIZE limit on the descriptors.
                    p = select.poll()
                    p.register(self._sock, select.POLLOUT)
                    p.register(self._wake_r, select.POLLIN)
                    ms = -1 if left is None else \
                        min(max(0, math.ceil(left * 1000)), _POLL_MAX_MS)
                    ready = p.poll(ms)
                    if self._closed is not None or \
                            any(fd == self._wake_r for fd, _ in ready):  # close()
                        raise _ClosedWhileSending()
                    continue
                sent = base + sum(counts)
                if sent == total and mark is not None:
                    mark._sent = True
                anc = []
                while n and views:
                    if n >= views[0].nbytes:
                        n -= views[0].nbytes
                        views.pop(0)
                    else:
                        views[0] = views[0][n:]
                        n = 0
        except _HandOff:
            raise  # nothing cut: the writer thread sends the rest
        except _ClosedWhileSending:
            if 0 < sent < total:
                self._cut(_errors.Closed("connection closed by the client while a "
                                         "request was being sent"))
            raise self._closed_error() from None
        except _LostWhileSending as lost:
            # The daemon closed; the reason it sent first, if it did, is queued.
            e = lost.err
            try:
                self._take_queued_notice()
            finally:
                self._connection_lost(self._protocol_error or _errors.Closed(
                    "connection to dspkd lost while sending: %s" % (e.strerror or e)))
            raise self._closed_error() from None
        except BaseException as e:
            if isinstance(e, Error) and not _foreign(e):
                raise  # _send_timed_out's dspk.Timeout: it closed what it had to
            # Anything else (KeyboardInterrupt, any exception a signal handler raises,
            # an OSError too) propagates; a message it cut closes the connection.  One
            # raised after the last byte went cut nothing: the request is pending.
            sent = base + sum(counts)
            # raised by the send call itself: a call started whose count was not
            # stored, and the exception is not one raised while the socket's own
            # was handled
            inside = len(counts) < len(starts) and (ours is None or e is ours)
            if sent == total and not inside and mark is not None:
                mark._sent = True
            if inside and sent < total:
                self._cut(_errors.Closed(
                    "a request was cut by %s inside a send system call, after %d of its "
                    "%d bytes and an unknown number more; the connection is closed"
                    % (type(e).__name__, sent, total)))
            elif 0 < sent < total:
                self._cut(_errors.Closed(
                    "a request was cut after %d of its %d bytes by %s; the connection "
                    "is closed" % (sent, total, type(e).__name__)))
            raise
        finally:
            # The socket's exception kept in ``ours`` holds this frame (its traceback)
            # and the frame holds it, with the message's views and ``mark``, the
            # request's future: a reference cycle on every send that waited for room,
            # which kept the future, its lent result and its daemon buffers until a
            # garbage collection (probe 22 C3).  So does the lost socket's error (``e``
            # of _LostWhileSending).
            ours = e = None

    def _take_queued_notice(self) -> None:
        """After a send failed (EPIPE, ECONNRESET): the daemon closed the connection
        and may have said why just before (a protocol.error: a refusal at connect, a
        limit), which a send that failed first never read.  What is queued on the
        socket is read without waiting and filed as any answer is, so the notice
        sets _protocol_error.  When another thread reads the connection now, that
        one files it: this waits (at most a second) until it has found the
        connection closed."""
        me = threading.get_ident()
        nested = True  # until this thread takes the reading: nothing to give back
        try:
            with self._lock:
                if self._reading and self._reader_ident != me:
                    deadline = time.monotonic() + 1.0
                    while self._closed is None and self._reading and \
                            self._reader_ident != me:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return
                        _wait_in(self._cond, min(left, _SEND_RECHECK))
                    if self._closed is not None:
                        return
                nested = self._reading
                self._reading, self._reader_ident = True, me
            for _ in range(64):  # the socket's buffer is bounded: so is this
                if self._protocol_error is not None or self._closed is not None:
                    break
                try:
                    while self._file_step():
                        pass
                    if not self._recv_nowait(lost=False):
                        break  # nothing queued, or the connection is gone
                    while self._file_step():
                        pass
                except Exception as e:  # noqa: BLE001 - undecodable: no notice to find
                    if _foreign(e):
                        raise
                    break
        finally:
            if not nested and self._reader_ident == me:  # no call before the store
                self._reading, self._reader_ident = False, 0
                self._readers_wake()
        self._run_inbox(strict=False)

    def _readers_wake(self) -> None:
        """Wakes the threads waiting for the reading thread to stop (it gave the
        reading back: stored before this call, so that no interruption can keep it;
        the waiters look again every _SEND_RECHECK seconds in case one cut this)."""
        with self._lock:
            if self._cond._waiters:  # type: ignore[attr-defined]  # (see _wait_in)
                self._cond.notify_all()

    def _cut(self, err: Error) -> None:
        """The stream cannot carry another message: every pending call ends with
        ``err``, later calls raise it, and the daemon sees the connection close."""
        self._connection_lost(err)
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass

    def _queue_free(self, buffer: int) -> None:
        """Frees ``buffer`` without waiting: at once when the send lock is free (else
        the thread holding it sends it when it lets it go), with msgid 0, whose answer
        is dropped.  Safe inside garbage collection: it never blocks.  In a child of
        fork() it does nothing: the buffer is the parent's."""
        self._dead_shared += [buffer]  # first, and no call: nothing can lose it
        if self._forked():
            return  # _close_forked drops the list: the buffer is the parent's
        self._flush_frees()

    def _flush_frees(self) -> None:
        """Sends the buffer.free owed, if the send lock can be had without waiting."""
        if self._forked():
            return
        sl = self._send_lock
        while self._dead_shared and self._closed is None:
            token = object()
            try:
                if not sl.claim(token, None, wait=False):
                    return  # the thread holding it sends them when it lets it go
                flushed = self._flush_frees_locked()
            finally:
                if sl.owner is token:  # no call before the store: nothing can cut it
                    sl.owner = None
                    self._after_send()
            if not flushed:
                return

    def _flush_frees_locked(self) -> bool:
        """Sends the buffer.free owed (the caller holds the send lock), each frame
        whole, without waiting for room: False when the socket's buffer is full (the
        rest goes with a later request)."""
        # Each buffer is taken off the list only once its frame is written: an
        # interruption in between (a signal handler's exception) frees it twice at
        # worst, which is harmless (the daemon never reuses a buffer id: the second
        # is an ENOBUF answer to msgid 0, dropped), never not at all.
        if self._orphans or self._dead_claims:
            self._take_orphans()
        while self._dead_shared and self._closed is None:
            try:
                item = self._dead_shared[-1]
            except IndexError:
                break
            buf = _owed_buffer(item)
            self._shared.pop(buf, None)  # its address may be mapped anew
            self._shared_refs.pop(buf, None)
            frame = msgpack.packb([0, 0, "buffer.free", [{"buffer": buf}]])
            # The count is stored by C code as sendmsg returns (see _write_locked),
            # and the rest of a frame sent in part is written by _write_locked, which
            # marks it whole: an interruption at any point cuts the stream (closes
            # the connection) only where part of the frame went and not the rest.
            got: List[int] = []
            whole = types.SimpleNamespace(_sent=False)
            try:
                try:
                    got.extend(map(self._sock.sendmsg, ([frame],), ([],),
                                   (_socket.MSG_DONTWAIT,)))
                except OSError as e:
                    if _foreign(e) or got:
                        raise  # a signal handler's: the caller's
                    if isinstance(e, (BlockingIOError, InterruptedError)):
                        return False  # nothing of it was sent: it goes later
                    return False  # the connection is going, and its buffers with it
                if got[-1] < len(frame):  # a frame this small goes whole, nearly always
                    self._write_locked([memoryview(frame)[got[-1]:]], [], None, got[-1],
                                       mark=whole)  # type: ignore[arg-type]
            except BaseException as e:
                if got and 0 < got[-1] < len(frame) and not whole._sent and \
                        self._closed is None:
                    self._cut(_errors.Closed(
                        "a request was cut after %d of its %d bytes by %s; the "
                        "connection is closed" % (got[-1], len(frame), type(e).__name__)))
                raise
            try:
                self._dead_shared.remove(item)
            except ValueError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass
        return True

    def _send_timed_out(self, sent: int, mark: Optional[TaskFuture] = None) -> None:
        """The timeout ran out while sending: dspk.Timeout.  With part of the request
        written, the stream cannot carry another message: the connection is closed
        (later calls raise dspk.Closed); with nothing written it stays."""
        err = _errors.Timeout("%s: could not send the request within %gs (the daemon "
                              "reads no more)%s" % (self._request_at(mark), self.timeout,
                                                    "; the connection is closed"
                                                    if sent else ""))
        if mark is not None and mark._handed:
            self._fail_call(mark, err)  # the future says why, before the cut fails it
        if sent:
            self._cut(_errors.Closed(
                "a request was cut after %d bytes when the timeout (%gs) ran out while "
                "sending; the connection is closed" % (sent, self.timeout)))
        try:
            raise err
        finally:
            err = mark = None  # see _no_cycle

    def _start(self, method: str, args: Optional[Mapping[str, Any]],
               decode: Optional[Callable[[Any], Any]] = None,
               progress: Optional[Progress] = None, is_async: bool = False,
               bigs: Optional[List[memoryview]] = None,
               fds: Optional[List[int]] = None,
               into: Optional[memoryview] = None,
               owner: Optional[List[TaskFuture]] = None,
               deadline: Any = _EACH) -> TaskFuture:
        """Sends a request; returns its future.  ``owner``: a list of the caller's
        that gets the future before anything is sent, so that when an exception
        (KeyboardInterrupt) comes after the request went out whole (``fut._sent``),
        the caller can still attach what its answer owes (a buffer to free, shared
        temporaries to give back): such a future stays pending and is completed by
        its answer."""
        if _FORKS[0] != self._forks:  # forked (_forked), before any lock: one held at
            raise self._fork_error()   # the fork stays held here
        if self._jobs or self._jobs_running:  # (_jobs_pending)
            self._after_jobs(method)
        if self._lent_back:
            self._temps_returned()
        fut = TaskFuture()
        fut._owner = self._wself
        fut._method = "task.run " + args["op"] if method == "task.run" and \
            isinstance(args, Mapping) and isinstance(args.get("op"), str) else method
        if owner is not None:
            owner += [fut]
        # The request's entries (its _Call, its direct read, its count of pending
        # submit() futures) are made inside the try whose except takes them back, each
        # marked made with no call between the store and the mark: an interruption at
        # any call here (CPython runs a handler as a C call returns) leaves none of
        # them behind for a request never sent (a count of pending futures left raised
        # kept a reader thread reading for ever).
        msgid = 0
        counted = False
        try:
            with self._lock:
                if self._closed is not None:
                    raise self._closed_error()
                msgid = self._next_id
                while msgid in self._pending:
                    msgid = msgid % 0xFFFFFFFF + 1
                self._next_id = msgid % 0xFFFFFFFF + 1
                fut._msgid = msgid
                if is_async:
                    self._async += 1
                    counted = True
                self._pending[msgid] = _Call(fut, decode, progress, is_async, method)
                if into is not None:  # buffer.read: its answer's bytes go straight to `into`
                    n = into.nbytes
                    self._direct[msgid] = (
                        b"\x94\x01" + msgpack.packb(msgid) + b"\xc0\x81\xa4data" +
                        (b"\xc4" + n.to_bytes(1, "big") if n < 1 << 8 else
                         b"\xc5" + n.to_bytes(2, "big") if n < 1 << 16 else
                         b"\xc6" + n.to_bytes(4, "big")), into)
            chunks = self._encode([0, msgid, method, [args] if args is not None else []],
                                  bigs or [])
            size = len(chunks[0]) if len(chunks) == 1 else \
                sum(memoryview(c).nbytes for c in chunks)  # (one: the packed bytes)
            if size > self._limits.get("max_message", _DEFAULT_MAX_MESSAGE):
                # The daemon would close the connection on its header (protocol.md,
                # Limits): refused here, and the connection stays usable.
                raise _errors.LimitExceeded(
                    "%s: a request of %d bytes, more than the daemon's max_message (%d)"
                    % (method, size, self.max_message))
            self._send_chunks(chunks, fds, fut, deadline)
        except BaseException:  # KeyboardInterrupt too
            if fut._sent:
                # Written whole: its answer will come and complete the future (the
                # caller attaches what it owes through ``owner``).
                if is_async:
                    fut._add_inline(self._on_async_done)
                    self._ensure_reader()
                raise
            with self._lock:  # nothing will answer it
                # (an interruption in the search for a free msgid leaves another
                # call's there: only this one's entries go)
                if getattr(self._pending.get(msgid), "future", None) is fut:
                    self._pending.pop(msgid, None)
                    self._direct.pop(msgid, None)
                if counted:
                    self._async -= 1
            raise
        if is_async:
            fut._add_inline(self._on_async_done)
            self._ensure_reader()
        return fut

    def _on_async_done(self, fut: concurrent.futures.Future) -> None:
        if fut.cancelled():
            msgid = getattr(fut, "msgid", 0)
            try:
                if self._closed is None:
                    self._start("task.cancel", {"msgid": msgid})
            except Error as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass

    def _call(self, method: str, args: Optional[Mapping[str, Any]] = None,
              decode: Optional[Callable[[Any], Any]] = None,
              bigs: Optional[List[memoryview]] = None) -> Any:
        return self._wait(self._start(method, args, decode, bigs=bigs))

    def _new_buffer(self, method: str, args: Mapping[str, Any],
                    fds: Optional[List[int]] = None, claim: Optional[_Claim] = None,
                    deadline: Any = _EACH) -> Any:
        """The answer of a call that makes a buffer (buffer.create, buffer.import).  When
        the caller stops waiting (dspk.Timeout), the buffer of an answer that comes later
        is freed by the next request instead of staying the connection's.  With
        ``claim`` (the caller's, held until it hands the buffer over), the buffer is
        owned by that claim from before the answer is read (see _Claim)."""
        for again in (False, True):
            owner: List[TaskFuture] = []
            try:
                fut = self._start(method, args, self._decode_buffer, fds=fds, owner=owner,
                                  deadline=deadline)
                if claim is not None:
                    ref = _ClaimRef(claim, self._dead_claims.append, fut)
                    self._claims.add(ref)  # (cut before: the except below owns it)
                    claim.ref = ref
                return self._wait(fut, deadline)
            except BaseException as e:  # dspk.Timeout, KeyboardInterrupt: no id for the caller
                # The daemon's refusal (ELIMIT, ENOMEM) answers the request: idle shared
                # temporaries count toward the same limits (max_buffers, the memory
                # quotas), so they are freed and the allocation tried once more.  A
                # signal handler's exception of these classes is no answer: it
                # propagates, as any other interruption does.
                if isinstance(e, (_errors.LimitExceeded, _errors.OutOfMemory)) and \
                        not from_signal_handler(e):
                    if not again and self._drop_idle_temps():
                        continue
                    raise
                for fut in owner:  # a request sent whole: its buffer is freed when made
                    if fut._sent:
                        self._orphans += [fut]  # first, and no call: nothing can lose it
                        fut._add_inline(self._orphaned_buffer)
                raise
        raise AssertionError("unreachable")

    def _decode_buffer(self, res: Any) -> Dict[str, Any]:
        """The answer of buffer.create or buffer.import: {buffer, device, size}.  A
        malformed one that still names a buffer has it freed (the caller gets none)."""
        try:
            _want(res, "map", "result")
            _field(res, "buffer", "uint")
            _field(res, "device", "str")
            _field(res, "size", "uint")
        except _Malformed:
            if isinstance(res, dict) and _KINDS["uint"](res.get("buffer")):
                self._queue_free(res["buffer"])
            raise
        return res

    def _orphaned_buffer(self, fut: concurrent.futures.Future) -> None:
        """The quick path of an orphan's free (see _orphans): at once when its answer
        comes.  An interruption that cuts it leaves the future on _orphans, whose
        free then goes with the next request (_take_orphans)."""
        if self._owe_orphan(fut):
            self._flush_frees()

    def _take_orphans(self) -> None:
        """Makes the buffer of each answered orphan (see _orphans) owed a free, the
        futures of the claims collected before their buffer was handed over (see
        _Claim) first among them (an interruption in between: freed twice at worst)."""
        while self._dead_claims:
            ref = self._dead_claims[-1]
            if not ref.handed:
                self._orphans += [ref.fut]
            self._dead_claims.pop()
            self._claims.discard(ref)
        for fut in list(self._orphans):
            if fut.done():  # else not answered yet
                self._owe_orphan(fut)

    def _owe_orphan(self, fut: concurrent.futures.Future) -> bool:
        """Takes the done ``fut`` off _orphans, its buffer (if it made one) owed a free
        first (an interruption in between: freed twice at worst); whether it was."""
        buf = _orphan_buffer(fut)
        if buf is not None:
            self._dead_shared += [buf]
        try:
            self._orphans.remove(fut)
        except ValueError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass
        return buf is not None

    def _closed_error(self) -> Error:
        err = self._closed or _errors.Closed("connection closed")
        return _errors.error_from({"code": err.code, "name": err.name,
                                   "message": err.message})

    # ---- the pump ----------------------------------------------------------------

    def _wait(self, fut: TaskFuture, deadline: Any = _EACH) -> Any:
        """The result of the request of a synchronous call (``fut``, which no caller
        sees), or its error raised; dspk.Timeout past ``deadline``.  The error raised
        is no longer the future's: it keeps a copy without a traceback (see
        _no_cycle)."""
        if deadline is _EACH:
            timeout = self._timeout
            deadline = None if timeout is None else time.monotonic() + timeout
        if not self._pump_until(fut, deadline):
            self._timed_out(fut)
        if fut._state != _cf.FINISHED:
            return fut.result()  # canceled: CancelledError (a new one each time)
        err = fut._exception
        if err is None:
            return fut._result  # the common case, without result()'s checks and waits
        try:
            twin = _untraced_twin(err)
            if twin is not None:
                fut._exception = twin  # type: ignore[attr-defined]
            raise err
        finally:
            err = twin = fut = None  # see _no_cycle

    def _pump_until(self, fut: concurrent.futures.Future, deadline: Optional[float]) -> bool:
        """Waits until ``fut`` is done (True) or ``deadline`` (time.monotonic(); None:
        none) passed (False): reads the connection itself, or waits for the thread
        that reads it.  The thread that reads may come here again from a callback
        (a nested wait): it goes on reading."""
        me = threading.get_ident()
        while fut._state not in _DONE_STATES:  # (done(), without a call)
            if getattr(fut, "_queued", False) and not self._is_callbacks_thread():
                # Answered, its settle queued behind progress calls on the callbacks
                # thread: nothing more comes to read for it.
                left = None if deadline is None else deadline - time.monotonic()
                if isinstance(fut, TaskFuture):  # its own wait: see TaskFuture._wait_done
                    fut._wait_done(None if left is None else max(left, 0))
                else:
                    concurrent.futures.wait([fut], None if left is None else max(left, 0))
                return fut.done()
            nested = True  # until this thread takes the reading: nothing to give back
            try:
                with self._lock:
                    if fut._state in _DONE_STATES:
                        break
                    if self._reading and self._reader_ident != me:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            return False
                        _wait_in(self._cond, _SEND_RECHECK if left is None
                                        else min(left, _SEND_RECHECK))
                        continue
                    nested = self._reading
                    self._reading, self._reader_ident = True, me
                while fut._state not in _DONE_STATES and not getattr(fut, "_queued", False):
                    if self._closed is not None:
                        if self._inbox:  # answers read before: completed first
                            self._read_once(0)
                            continue
                        # Everything pending failed; a future not among them (a staged
                        # result's) would wait for ever.
                        raise self._closed_error()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    if getattr(fut, "_job", None) is not None:
                        # A submit() of the worker's: the worker may complete it (an
                        # error, a task answered before it followed it) with no byte
                        # coming here, so this looks again every _SEND_RECHECK.
                        left = _SEND_RECHECK if left is None else min(left, _SEND_RECHECK)
                    self._read_once(left)
            finally:
                if not nested and self._reader_ident == me:  # no call before the store
                    self._reading, self._reader_ident = False, 0
                    self._readers_wake()
        return True

    def _is_reader(self) -> bool:
        """Whether this thread is the one reading the connection now."""
        return self._reading and self._reader_ident == threading.get_ident()

    def _pump_for(self, fut: concurrent.futures.Future, timeout: Optional[float]) -> None:
        """TaskFuture.result(timeout) on the reading thread: reads until ``fut`` is done;
        concurrent.futures.TimeoutError when ``timeout`` seconds pass first."""
        deadline = _deadline_of(timeout)
        if not self._pump_until(fut, deadline):
            raise concurrent.futures.TimeoutError()

    def _request_at(self, fut: Optional[TaskFuture]) -> str:
        """What a client-side error names: the request's method and id, and the
        daemon's socket (``"ping (request 4) to dspkd at /run/dspk.sock"``)."""
        method = getattr(fut, "_method", "")
        msgid = getattr(fut, "msgid", 0)
        what = "%s (request %d)" % (method, msgid) if method and msgid else \
            method or ("request %d" % msgid if msgid else "a request")
        return "%s to dspkd at %s" % (what, self._socket_path)

    def _timed_out(self, fut: TaskFuture) -> None:
        raise _errors.Timeout("%s: no answer within %gs" % (self._request_at(fut),
                                                             self.timeout))

    def _read_once(self, wait: Optional[float] = None) -> None:
        """Reads what the socket has, waiting at most ``wait`` seconds (None: for ever)
        for something, and files every whole message; then completes the futures
        answered, in order (their callbacks run here, once every byte read is filed,
        so that a callback may read the connection in turn).  Work an interruption
        left (bytes received but not filed, answers filed but not completed) is done
        first, without reading more.

        Every step is resumable: the bytes received, the decoder's progress through
        them and the messages decoded are the connection's (_held, _rlog, _inbox),
        each updated by C code together with the step it records (_then), so an
        interruption (a signal handler's KeyboardInterrupt) anywhere here cuts
        nothing: it propagates, and the next read goes on where it stopped.  Only an
        exception out of a receive system call itself leaves bytes unknown (a cut:
        _recv_nowait closes the connection); bytes that do not decode as the
        protocol's close it too (the callers get dspk.Closed)."""
        try:
            if self._closed is not None:
                self._run_inbox()  # answers read before the connection was lost
                return
            if not self._owed():
                ms = -1 if wait is None else \
                    min(max(0, math.ceil(wait * 1000)), _POLL_MAX_MS)
                try:
                    if not self._poll.poll(ms):
                        return  # nothing within wait (or a wait cut at _POLL_MAX_MS)
                except (OSError, ValueError) as e:
                    if _foreign(e):
                        raise  # a signal handler's: it cut nothing
                    # the socket is gone: recv says so
                if not self._recv_nowait():
                    if self._closed is not None:
                        self._run_inbox()
                    return
                d = self._rlog[-1].direct
                while d is not None and d.got() < d.n:
                    # An answer received in place: what more is there is taken now
                    # (each count stored as above), without waiting.
                    if not self._recv_nowait():
                        if self._closed is not None:
                            self._run_inbox()
                            return
                        break
            while self._file_step():
                pass
            self._run_inbox()
        except _NotProtocol as e:
            if _foreign(e):
                raise
            self._undecodable(str(e))
        except Exception as e:  # noqa: BLE001
            if _foreign(e) or self._closed is not None:
                raise  # a signal handler's (it cut nothing), or the connection's end
            # The decoder's own error (bad bytes): the callers get dspk.Closed.
            self._undecodable("undecodable data from the daemon (%s)"
                              % _errors._describe(e))

    def _undecodable(self, what: str) -> None:
        """Bytes from the daemon that are no message of the protocol: the answers
        decoded before them complete (none decoded after them), then the connection
        is closed."""
        try:
            self._run_inbox(strict=False)
        finally:
            self._cut(_errors.Closed(what + "; the connection is closed"))
            self._inbox.clear()

    def _owed(self) -> bool:
        """Whether work an interruption left is waiting: answers decoded but not
        completed, bytes received but not filed, a buffer.read answer received whole
        in place but not completed."""
        if self._inbox:
            return True
        st = self._rlog[-1]
        if st.fresh:
            return True
        d = st.direct
        if d is not None:
            return d.got() >= d.n
        if not self._held:
            return False
        tok, _, k = self._held[-1]
        return (st.pos if st.tok is tok else 0) < k

    def _recv_nowait(self, lost: bool = True) -> Optional[int]:
        """Receives what the socket has, without waiting, into the destination of the
        buffer.read answer being received in place, else into _rbuf: the count
        (None: nothing there; 0: the connection is gone, closed here).  The count is
        stored by C code, in the same chain of C calls as the recv_into (list.extend
        of a zip of a map: no signal handler runs in between), in a list of the
        connection's (_held, or the answer's ``recvs``): an interruption as the call
        returns loses no byte.  A token stored by C code as the call starts tells an
        exception out of the call itself (EINTR and a handler's exception: the bytes
        it took are unknown, so the stream is cut) from one before it.  Without
        ``lost``, a connection found gone is left to the caller to close."""
        st = self._rlog[-1]
        d = st.direct
        tok = object()
        if d is not None:
            got = d.got()
            done, into, head = d.recvs, d.into[got:], ((tok,), (got,))
        else:
            if len(self._held) > 1:
                del self._held[:-1]  # only the last counts
            if len(self._rlog) > 1:
                del self._rlog[:-1]
            into = self._rbuf
            done, head = self._held, ((tok,), (into,))
        calls = self._rcalls
        if calls:
            del calls[:]
        try:
            done.extend(zip(*head, map(self._sock.recv_into,  # (_then, written out)
                                       map(_SECOND, zip(map(calls.append, (tok,)),
                                                        (into,))),
                                       (0,), (_socket.MSG_DONTWAIT,))))
        except BaseException as e:
            if done and done[-1][0] is tok:
                raise  # after the call returned: its bytes are held (filed later)
            if not (calls and calls[-1] is tok):
                raise  # before the call: nothing taken
            if isinstance(e, OSError) and not _foreign(e):
                if isinstance(e, (BlockingIOError, InterruptedError)):
                    return None
                # a reset: a protocol.error read before it still counts
                if lost:
                    self._connection_lost(self._protocol_error or _errors.Closed(
                        "connection to dspkd lost: %s" % (e.strerror or e)))
                return 0
            # Out of the call itself (a handler run as it was interrupted): what it
            # took is unknown, so the stream is inside a message.
            self._cut(_errors.Closed(
                "%s while an answer was being read (inside a receive system call, the "
                "bytes it took unknown); the connection is closed" % type(e).__name__))
            raise
        n = done[-1][-1]
        if n == 0:
            if lost:
                self._connection_lost(self._protocol_error or _errors.Closed(
                    "the daemon closed the connection"))
        elif d is None and n == len(into) and n < 16 * _READ_CHUNK:
            self._rbuf = bytearray(2 * n)  # a large answer: read more at once
        return n

    def _file_step(self) -> bool:
        """One step of filing the bytes received: False when none is left to do.
        Whole messages go from the decoder to _inbox (list.extend: each one is in
        the inbox once the decoder let it go); bytes are fed to the decoder and the
        position recorded in one chain of C calls (_then); an awaited buffer.read
        answer found at a message's start is received in place (_take_direct)."""
        st = self._rlog[-1]
        unpacker = st.unpacker
        if st.fresh:
            # The whole messages the last feed completed (an interruption before
            # this leaves the state fresh: taken here by the next read).
            self._inbox.extend(unpacker)
            self._rlog.append(_RState(st.tok, st.pos, st.fed, st.direct, unpacker, False))
            return True
        d = st.direct
        if d is not None:
            if d.got() < d.n:
                return False  # the rest comes from the socket
            self._direct_done(st)
            return True
        if not self._held:
            return False
        tok, buf, k = self._held[-1]
        pos = st.pos if st.tok is tok else 0
        if pos >= k:
            return False
        cut = self._find_direct(buf, pos, k) if self._direct else None
        end = k if cut is None else cut[0]
        if end == pos and unpacker.tell() != st.fed:
            # Not at a message's start: those bytes lie inside another message.
            end = pos + 1
        if end > pos:
            fed = st.fed + end - pos
            self._rlog.extend(map(_SECOND, zip(  # (_then, written out)
                map(unpacker.feed, (memoryview(buf)[pos:end],)),  # (feed copies)
                (_RState(tok, end, fed, None, unpacker, True),))))
            # The fresh step above, taken at once (an interruption before it leaves
            # the state fresh, for the next step): the whole messages this feed
            # completed go to the inbox.
            self._inbox.extend(unpacker)
            self._rlog.append(_RState(tok, end, fed, None, unpacker, False))
            return end < k  # False: every byte received is filed
        assert cut is not None
        self._take_direct(st, tok, buf, pos, k, cut[1])
        return True

    def _find_direct(self, buf: bytearray, pos: int, end: int) -> Optional[Tuple[int, int]]:
        """(offset, msgid) of the first awaited buffer.read answer that starts in
        buf[pos:end], or None."""
        best: Optional[Tuple[int, int]] = None
        for msgid, (head, _) in list(self._direct.items()):
            at = buf.find(head, pos, end)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, msgid)
        return best

    def _take_direct(self, st: "_RState", tok: Any, buf: bytearray, pos: int, end: int,
                     msgid: int) -> None:
        """Starts receiving the buffer.read answer msgid, which starts at buf[pos],
        straight into its destination: the bytes of buf that belong to it are copied
        (again, harmlessly, where an interruption cut this before the state below was
        stored), the rest comes from the socket into the destination itself
        (_recv_nowait); the decoder is taken over by a fresh one once it is whole
        (_direct_done)."""
        head, into = self._direct[msgid]
        call = self._pending.get(msgid)
        skip = len(head)
        have = min(into.nbytes, end - pos - skip)
        into[:have] = memoryview(buf)[pos + skip:pos + skip + have]
        self._rlog.append(_RState(tok, pos + skip + have, st.fed,
                                  _Direct(msgid, call, into, have), st.unpacker))

    def _direct_done(self, st: "_RState") -> None:
        """The buffer.read answer received in place is whole: its completion goes to
        the inbox (twice at worst, where an interruption cut this: the second does
        nothing), and a fresh decoder starts at the message boundary after it."""
        d = st.direct
        assert d is not None
        if d.call is not None:
            self._inbox.append((self._answered, (d.msgid, d.call, {"size": d.n}, None)))
        self._direct.pop(d.msgid, None)  # (harmless twice)
        self._rlog.append(_RState(st.tok, st.pos, 0, None, _new_unpacker()))

    def _run_inbox(self, strict: bool = True) -> None:
        """Completes what _inbox holds, in order: a message is decoded into its
        completion (the inbox then holds that in its place: one store), which is run,
        then taken off (by identity: a callback that read the connection in turn ran
        it already).  An interruption leaves the rest for the next read; one that
        lands after a completion ran, before it was taken off, runs it once more
        (settling a future twice does nothing).  A message that is no message of the
        protocol raises _NotProtocol (with ``strict``; else it is dropped with every
        message decoded after it: the stream is broken there, _undecodable)."""
        inbox = self._inbox
        while inbox:
            item = inbox[0]
            if type(item) is not tuple:  # a message, as the decoder gave it
                try:
                    entry = self._dispatch(item)
                except _NotProtocol:
                    if strict:
                        raise
                    # The stream is broken here: what was decoded after this
                    # message is no answer to trust (its calls fail with Closed).
                    del inbox[:]
                    return
                if inbox and inbox[0] is item:  # (no call in between)
                    if entry is None:
                        del inbox[0]
                    else:
                        inbox[0] = entry
                continue
            fn, args = item
            fn(*args)
            if inbox and inbox[0] is item:  # the common case: nothing ran it meanwhile
                del inbox[0]
            else:
                for i, x in enumerate(inbox):
                    if x is item:
                        del inbox[i]
                        break
            with self._lock:
                # Threads wait on _cond only through _wait_in, which joins _waiters
                # under this lock: none there, none to wake.
                if self._cond._waiters:  # type: ignore[attr-defined]
                    self._cond.notify_all()

    def _answered(self, msgid: int, call: "_Call", value: Any,
                  exc: Optional[BaseException]) -> None:
        """An answer's completion: its future is settled (again, harmlessly, where
        this runs twice), then its call leaves _pending (once).  In that order: a
        submit() future stays counted (_async, which keeps the reader thread
        reading) until it is settled, wherever an interruption cuts this."""
        self._settle_after(call.future, value, exc)
        with self._lock:
            if self._pending.get(msgid) is call:
                del self._pending[msgid]
                if call.is_async:
                    self._async -= 1  # (no call since the del)
            self._direct.pop(msgid, None)

    def _dispatch(self, msg: Any) -> Optional[Tuple[Callable[..., Any], Tuple[Any, ...]]]:
        """The completion of one message (None: nothing to do): an answer's
        (_answered), or a task.progress call's.  It changes nothing itself (a
        protocol.error is noted, an unawaited answer's in-place read dropped, both
        harmless twice), so that an interruption here leaves the message to be
        dispatched again."""
        if type(msg) is list and len(msg) == 4 and msg[0] == 1 and \
                type(msg[1]) is int and msg[1] >= 0:
            pass  # an answer (the common case, checked first: the same test as below)
        elif not isinstance(msg, list) or len(msg) not in (3, 4) or \
                not (msg[0] == 1 and len(msg) == 4 and _KINDS["uint"](msg[1]) or
                     msg[0] == 2 and len(msg) == 3 and isinstance(msg[1], str) and
                     isinstance(msg[2], list)):
            text = repr(msg)
            raise _NotProtocol("the daemon sent a message that is not [1, msgid, error, "
                               "result] nor [2, method, params]: %s" % (
                                   text if len(text) <= 80 else text[:77] + "..."))
        if msg[0] == 1:
            call = self._pending.get(msg[1])
            if call is None:
                self._direct.pop(msg[1], None)
                return None
            if msg[2] is not None:
                what = _call_text(call)
                if not isinstance(msg[2], dict):
                    err = _errors.ProtocolError("%s: a malformed answer: its error is %s, "
                                                "not a map" % (what, _kind(msg[2])))
                elif msg[3] is not None:  # protocol.md: exactly one of the two is nil
                    err = _errors.ProtocolError("%s: a malformed answer: both its error "
                                                "and its result are set" % what)
                else:
                    err = _errors.error_from(msg[2])
                return (self._answered, (msg[1], call, None, err))
            try:
                value = call.decode(msg[3]) if call.decode else msg[3]
            except Exception as e:  # noqa: BLE001 - a bad answer fails its call only
                if from_signal_handler(e):
                    raise  # a signal handler's: the message is dispatched again
                err = _as_error(e)
                what = _call_text(call)
                if isinstance(e, _Malformed):
                    err = _errors.ProtocolError("%s: a malformed answer: %s" % (what, e))
                elif not isinstance(err, Error):  # a malformed answer (KeyError...)
                    err = _errors.ProtocolError("%s: a malformed answer (%s)" % (
                        what, _errors._describe(e)))
                done = (self._answered, (msg[1], call, None, err))
                call = err = None  # see _no_cycle
                return done
            return (self._answered, (msg[1], call, value, None))
        # A notification [2, method, params]
        params = msg[2][0] if msg[2] else {}
        if msg[1] == "task.progress" and isinstance(params, dict):
            call = self._pending.get(params.get("msgid"))
            if call is not None and call.progress is not None:
                try:
                    what = _errors._wire_text(params.get("what"))
                    frac = float(params.get("fraction", 0.0))
                except (TypeError, ValueError) as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's: the caller's, as it is
                    return None
                return (self._progress_post, (call.future, call.progress, what, frac))
        elif msg[1] == "protocol.error" and isinstance(params, dict):
            self._protocol_error = _errors.error_from(params)
        return None

    # ---- the callbacks thread -----------------------------------------------------

    def _post(self, fn: Callable[..., Any], args: Tuple[Any, ...]) -> None:
        """Queues ``fn(*args)`` (which keeps what it raises) for the dspk-callbacks
        thread, launching it where none runs or is launched (by _launch, as the reader
        and the worker: threading.Thread.start() waits for the new thread in Python
        code, and a signal handler's exception there, on the main thread reading the
        connection, left that thread blocked for ever in its Event.set(), listed by
        threading.enumerate()).  The token is set once the launch returned, or by the
        thread itself where an interruption cut that (_callbacks_main).  Where no
        thread can be started, the queue is run here (the thread completing the
        future, as before)."""
        with self._cb_lock:
            self._cb_queue.append((fn, args))
            self._cb_cond.notify_all()
            t = self._cb_thread
            if t is not None and t.pid == os.getpid():
                return  # (one of the parent's, in a child of fork(), runs not here)
            token = _Runner()
            try:
                _launch(self._callbacks_main, token)
            except RuntimeError as e:  # "can't start new thread"
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass
            else:
                if self._cb_thread is t:  # (not taken up by the thread meanwhile)
                    self._cb_thread = token
                return
        while self._run_one_callback():
            pass

    def _run_one_callback(self) -> bool:
        """Runs the first queued callback here; False when none was queued."""
        with self._cb_lock:
            if not self._cb_queue:
                return False
            fn, args = self._cb_queue.popleft()
        try:
            fn(*args)
        except BaseException:  # noqa: B036, BLE001 - each keeps its own; see _run_callback
            pass
        return True

    def _callbacks_main(self, token: _Runner) -> None:
        """The dspk-callbacks thread: runs the queue in order, and ends when it is
        empty (the next _post() launches another), or when another thread is the
        callbacks thread (two launched where an interruption cut the storing of the
        first one's token: one runs the queue).  Takes up the work where no thread
        has (its launch's caller was interrupted before it set the token).

        It is named "dspk-callbacks" for the callbacks it runs
        (threading.current_thread().name): started by _thread, its Thread object is
        the dummy threading makes on the first current_thread(), which stays in
        threading's table of running threads when the thread ends (listed by
        threading.enumerate() as alive for good): it is taken out as the thread
        ends.  No signal handler runs on this thread, so nothing cuts that."""
        me = token.ident = _thread.get_ident()
        this = threading.current_thread()
        this.name = "dspk-callbacks"
        try:
            with self._cb_lock:
                t = self._cb_thread
                if t is None or t.pid != token.pid:
                    self._cb_thread = token
            while True:
                with self._cb_lock:
                    if not self._cb_queue or self._cb_thread is not token:
                        if self._cb_thread is token:
                            self._cb_thread = None
                        return
                self._run_one_callback()
        finally:
            active = getattr(threading, "_active", None)
            guard = getattr(threading, "_active_limbo_lock", None)
            if isinstance(active, dict) and guard is not None:
                with guard:
                    if active.get(me) is this:
                        del active[me]

    def _is_callbacks_thread(self) -> bool:
        t = self._cb_thread
        return t is not None and t.ident == _thread.get_ident()

    def _callbacks_wait(self, fut: concurrent.futures.Future,
                        timeout: Optional[float]) -> None:
        """result()/exception() of ``fut`` in a callback (on the callbacks thread): runs
        the queued callbacks meanwhile (the settle of ``fut`` may be among them), and
        reads the connection where no reader thread does; concurrent.futures'
        TimeoutError when ``timeout`` seconds pass first."""
        deadline = _deadline_of(timeout)
        while not fut.done():
            if self._run_one_callback():
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise concurrent.futures.TimeoutError()
            step = _CB_RECHECK if left is None else min(left, _CB_RECHECK)
            if not getattr(fut, "_queued", False) and self._thread is None:
                self._pump_until(fut, time.monotonic() + step)  # no reader: read here
            else:
                with self._cb_lock:
                    if not self._cb_queue and not fut.done():
                        self._cb_cond.wait(step)

    def _progress_post(self, fut: concurrent.futures.Future, fn: Progress, what: str,
                       frac: float) -> None:
        with self._cb_lock:
            self._cb_progress[id(fut)] = self._cb_progress.get(id(fut), 0) + 1
        self._post(self._progress_run, (fut, fn, what, frac))

    def _progress_run(self, fut: concurrent.futures.Future, fn: Progress, what: str,
                      frac: float) -> None:
        try:
            self._progress(fn, what, frac)
        finally:
            with self._cb_lock:
                n = self._cb_progress.pop(id(fut), 1) - 1
                if n > 0:
                    self._cb_progress[id(fut)] = n

    def _settle_after(self, fut: concurrent.futures.Future, value: Any = None,
                      exc: Optional[BaseException] = None) -> None:
        """Settles ``fut`` here, or, while progress calls of its are queued, queues the
        settle behind them (the future completes once they ran)."""
        if not self._cb_progress:
            # No progress call queued (one of fut's is posted by this thread, before
            # its answer is dispatched, so it would be there): settled here.
            if type(fut) is TaskFuture:  # (_settle's first case, without the call)
                try:
                    fut._finish(value if exc is None else None, exc)
                except concurrent.futures.InvalidStateError as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's: the caller's, as it is
                    pass  # canceled by the caller meanwhile
            else:
                self._settle(fut, value, exc)
            return
        with self._cb_lock:
            queued = self._cb_progress.get(id(fut), 0) > 0
            if queued:
                fut._queued = True  # type: ignore[union-attr]
        if queued:
            self._post(self._settle_queued, (fut, value, exc))
        else:
            self._settle(fut, value, exc)

    def _settle_queued(self, fut: concurrent.futures.Future, value: Any,
                       exc: Optional[BaseException]) -> None:
        self._settle(fut, value, exc)
        with self._lock:
            self._cond.notify_all()

    @staticmethod
    def _progress(fn: Progress, what: str, frac: float) -> None:
        """Runs a ``progress`` callback; whatever it raises, BaseExceptions included
        (KeyboardInterrupt, SystemExit), is its own and ignored: it must neither stop
        the dspk-callbacks thread (which runs it) nor surface in another call."""
        try:
            fn(what, frac)
        except BaseException:  # noqa: B036, BLE001
            pass

    @staticmethod
    def _settle(fut: concurrent.futures.Future, value: Any = None,
                exc: Optional[BaseException] = None) -> None:
        try:
            if isinstance(fut, TaskFuture):  # whose set_result() is refused to users
                fut._finish(value if exc is None else None, exc)
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)
        except concurrent.futures.InvalidStateError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            pass  # canceled by the caller meanwhile

    def _connection_lost(self, err: Error) -> None:
        with self._lock:
            if self._closed is None:
                self._closed = err
        self._fail_all()

    def _fail_all(self) -> None:
        with self._lock:
            calls = list(self._pending.values())
            self._pending.clear()
            self._direct.clear()
            self._async = 0
            err = self._closed
            self._cond.notify_all()
        try:
            self._settle_calls(calls, err)
        except BaseException:  # noqa: B036 - an interruption: every call once more
            self._settle_calls(calls, err)  # (a settled one: nothing)
            raise

    def _settle_calls(self, calls: List["_Call"], err: Optional[Error]) -> None:
        """Fails the futures of ``calls`` (taken off _pending) with ``err``."""
        for call in calls:
            self._settle(call.future, exc=_errors.error_from(
                {"code": err.code, "name": err.name, "message": err.message}
                if err else {"code": -15, "name": "ECLOSED", "message": "closed"}))

    def _ensure_reader(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._cond.notify_all()
                return
            t = _Runner()
            try:
                _launch(self._reader_main, t)  # see _launch: no half-started thread
            except RuntimeError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                # No thread to be had (RuntimeError "can't start new thread"): the
                # request is sent, so no error here; result() and exception() of the
                # futures read the connection themselves while no reader runs (_pump).
                return
            if self._thread is None:  # (it took up the reading itself meanwhile)
                self._thread = t

    def _reader_main(self, token: _Runner) -> None:
        """Reads while submit() futures are pending; exits when none is (the next
        submit() starts it again).  Takes up the reading as the reader when no other
        thread has (the launch's caller was interrupted before it set the token)."""
        me = token.ident = _thread.get_ident()
        with self._lock:
            if self._thread is None:
                self._thread = token
        while True:
            try:
                with self._lock:
                    while self._reading and (self._async or self._owed()) and \
                            self._closed is None and self._thread is token:
                        self._cond.wait(_SEND_RECHECK)
                    if not self._async and not self._owed() or \
                            self._closed is not None or self._thread is not token:
                        if self._thread is token:
                            self._thread = None
                        self._cond.notify_all()
                        return
                    self._reading, self._reader_ident = True, me
                while self._closed is None:
                    with self._lock:
                        # (work an interruption of another reader left: done first)
                        if not self._async and not self._owed():
                            break
                    try:
                        self._read_once()
                    except BaseException:  # noqa: B036, BLE001
                        # No signal lands on this thread and callbacks keep what they
                        # raise: whatever comes here must not stop the reading while
                        # futures are pending (a cut connection ends the loop).
                        pass
            finally:
                if self._reader_ident == me:  # no call before the store
                    self._reading, self._reader_ident = False, 0
                    self._readers_wake()

    # ---- the worker: submit()s that would wait ------------------------------------

    @property
    def _jobs_pending(self) -> int:
        """The deferred submit()s whose task is not sent yet: queued, or taken by the
        worker and not yet sent.  Derived, never stored: see _jobs."""
        return len(self._jobs) + self._jobs_running

    def _is_worker(self) -> bool:
        """Whether this thread is the client's worker (running deferred submit()s)."""
        w = self._worker
        return w is not None and w.ident == _thread.get_ident()

    def _ensure_worker_locked(self) -> None:
        """Under _work_lock: launches a worker where jobs are queued and none runs or
        is launched (RuntimeError where no thread can be had).  The token is set only
        once the launch returned; a launch whose return an interruption cut leaves it
        None, and the thread launched takes up the work itself (_worker_main), or a
        later call launches another: the queue never stays with no worker."""
        if self._jobs and self._worker is None and self._closed is None:
            token = _Runner()
            _launch(self._worker_main, token)
            if self._worker is None:
                self._worker = token

    def _ensure_worker(self) -> None:
        """_ensure_worker_locked for a call that waits for the jobs queued: where no
        thread can be had, the jobs queued end with dspk.LimitExceeded (nothing of
        them was sent) rather than being waited for in vain."""
        with self._work_lock:
            try:
                self._ensure_worker_locked()
                return
            except RuntimeError as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                if self._worker is not None:
                    return
                why = str(e)
        self._fail_queued(lambda: _errors.LimitExceeded(
            "submit: no thread for the client's worker (%s)" % why))

    def _no_wait(self, always: bool = True) -> None:
        """In submit()'s first attempt, on the caller's thread: _Defer where the op would
        wait for an answer (``always``), or, at the sending of its task, while earlier
        submit()s are still with the worker (their tasks are sent first)."""
        if getattr(self._tl, "deferring", False) and (always or self._jobs_pending):
            raise _Defer()

    # The operands of each op (parameters of its method): what _snapshot copies.
    _OPERANDS = {"gemm": ("a", "b", "c"), "fft": ("x",), "fir": ("x", "h"),
                 "contract": ("a", "b"), "reduce": ("x",), "map": ("a", "b"),
                 "kernel": ("tensors",)}

    def _snapshot(self, op: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                  ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The arguments of a deferred submit() with a copy of each plain numpy operand
        that shares the caller's memory, so that the caller may write its arrays once
        submit() returns, as after an op sent at once.  DeviceArrays and shared arrays
        (and views of them) are references, as in any op: kept."""
        bound = inspect.signature(getattr(self, op)).bind(*args, **kwargs)

        def own(x: Any, what: str, pos: int) -> Any:
            if isinstance(x, DeviceArray) and x.client is not self:
                # refused now, as an op sent at once refuses it, not by the worker
                raise _errors.InvalidArgument(_foreign_array("input %d" % pos, x))
            if x is None or isinstance(x, DeviceArray):
                return x
            a = _as_array(x, what, self._limits)
            ref = self._shared_ref(a)
            if ref is not None and ref[1] % max(a.dtype.itemsize, 1) == 0:
                return x  # sent as a reference to the shared array, as x
            try:
                shares = np.may_share_memory(a, x)
            except Exception as e:  # noqa: BLE001 - an object numpy cannot compare: copied
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                shares = True
            return a.copy() if shares else a

        for k, name in enumerate(self._OPERANDS[op]):
            if name not in bound.arguments:
                continue
            v = bound.arguments[name]
            if name == "tensors":
                bound.arguments[name] = tuple(own(x, "input %d" % i, i)
                                              for i, x in enumerate(v))
            else:
                bound.arguments[name] = own(v, name, k)
        out = bound.arguments.get("out")
        if isinstance(out, DeviceArray) and out.client is not self:
            raise _errors.InvalidArgument(_foreign_array("out=", out))
        return bound.args, dict(bound.kwargs)

    def _defer(self, op: str, args: Tuple[Any, ...], kwargs: Dict[str, Any],
               progress: Optional[Progress]) -> TaskFuture:
        """Hands submit(op, ...) to the worker thread; returns its future at once."""
        args, kwargs = self._snapshot(op, args, kwargs)
        user = TaskFuture()
        user._owner = weakref.ref(self)
        job = _Job(getattr(self, "_op_" + op), args, kwargs, progress, user)
        user._job = job
        user._add_inline(self._job_done)  # (no closure over the job: see _job_done)
        with self._work_lock:
            if self._closed is not None:
                raise self._closed_error()
            self._jobs.append(job)  # queued and counted at once (one C call)
            self._work_cond.notify_all()
            try:
                self._ensure_worker_locked()
            except RuntimeError as e:  # _thread: "can't start new thread"
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                if self._worker is None and job in self._jobs:
                    # Nothing of this submit() was sent (nor of those before it,
                    # queued with no worker either): it is refused.
                    self._jobs.remove(job)
                    self._work_cond.notify_all()
                    raise _errors.LimitExceeded("submit: no thread for the client's "
                                                "worker (%s)" % e) from None
        # An interruption anywhere here leaves the job queued with a worker launched,
        # or queued for the next call to launch one: submit() raises it, and the
        # future, not returned, is ended by its job as any other.
        return user

    def _worker_main(self, me: _Runner) -> None:
        """Runs the deferred submit()s in order; exits when none is queued (the next
        one starts it again).  Started by _launch (the interpreter's exit never waits
        for it); takes up the work when no other worker has (the launch's caller was
        interrupted before it set the token)."""
        me.ident = _thread.get_ident()
        with self._work_lock:
            if self._worker is None and self._jobs and self._closed is None:
                self._worker = me
        while True:
            with self._work_lock:
                if not self._jobs or self._worker is not me:
                    if self._worker is me:
                        self._worker = None
                    self._work_cond.notify_all()
                    return
                self._jobs_running += 1  # first: the job is never uncounted
                job = self._jobs.popleft()
            self._run_job(job)

    def _work_until(self, job: _Job) -> None:
        """On the worker's thread (a callback it runs waits for ``job``): runs the jobs
        queued up to ``job`` here, in order."""
        while True:
            with self._work_lock:
                if job not in self._jobs:
                    return
                self._jobs_running += 1  # as in _worker_main
                nxt = self._jobs.popleft()
            self._run_job(nxt)

    def _run_job(self, job: _Job) -> None:
        """Runs one deferred submit() (on the worker's thread, which counted it in
        _jobs_running as it took it off the queue): its staging and the sending of its
        task (waiting for their answers as a synchronous call does), then its future
        follows the task's.  Every failure goes to the future, as a dspk.Error."""
        inner = None
        err: Optional[BaseException] = None
        try:
            if not job.future.done() and not job.stop:
                inner = job.fn(*job.args, progress=job.progress, is_async=True,
                               **job.kwargs)
        except BaseException as e:  # noqa: B036 - the future's: see below
            err = _as_error(e)
            if isinstance(err, Exception) and not isinstance(err, Error):
                err = _errors.InternalError("%s: %s" % (
                    getattr(job.fn, "__name__", "submit")[4:], _errors._describe(err)))
        finally:
            with self._work_lock:
                job.inner = inner
                stop = job.stop
            try:
                if inner is not None:
                    job.future._msgid = inner.msgid
                    job.future._via = inner
                    if stop or job.future.done():  # canceled while it was being sent
                        inner.cancel()  # before the calls waiting for this job go on
            finally:
                with self._work_lock:
                    self._jobs_running -= 1
                    self._work_cond.notify_all()
        user = job.future
        if inner is None:
            if err is not None:
                self._settle(user, exc=err)
            job = user = err = None  # see _no_cycle (follow below is not made)
            return

        def follow(f: concurrent.futures.Future) -> None:
            if f.cancelled():
                self._settle(user, exc=_errors.Canceled("task canceled"))
            elif f.exception() is not None:
                self._settle(user, exc=f.exception())
            else:
                self._settle(user, f.result())

        inner._add_inline(follow)

    def _job_done(self, user: concurrent.futures.Future) -> None:
        """The future of a deferred submit() is done: canceled (future.cancel()), its
        task is canceled too, or never sent.  Then the future lets go of its job
        (``_job``; what it sent is its ``_via``): the job holds the future, and that
        reference cycle kept the future, its lent result and its daemon buffers
        until a garbage collection (probe 22 C3).  A job still queued (canceled
        before the worker took it) holds the future until the worker skips it."""
        job = getattr(user, "_job", None)
        if job is None:
            return  # run again after an interruption cut it past its end
        if user.cancelled():
            with self._work_lock:
                inner = job.inner
                job.stop = True
            if inner is not None:
                inner.cancel()
        user._job = None  # type: ignore[attr-defined]

    def _fail_jobs(self) -> None:
        """close(): the deferred submit()s not yet taken by the worker end with
        dspk.Closed at once (the one it runs ends as its waits do)."""
        self._fail_queued(self._closed_error)

    def _fail_queued(self, err: Callable[[], Error]) -> None:
        """Ends the deferred submit()s queued (not taken by the worker) with ``err()``.
        Each is settled before it leaves the queue, so that an interruption anywhere
        here leaves no job off the queue with its future pending (a job settled and
        still queued is skipped by the worker, or failed by the next call here)."""
        while True:
            with self._work_lock:
                if not self._jobs:
                    self._work_cond.notify_all()
                    return
                job = self._jobs[0]
            self._settle(job.future, exc=err())
            with self._work_lock:
                try:
                    self._jobs.remove(job)
                except ValueError as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's: the caller's, as it is
                    pass  # taken by the worker meanwhile (it skips a done future)

    def _after_jobs(self, method: str) -> None:
        """Before a request of another call is sent: waits until the worker has sent the
        tasks of the submit()s made before (requests reach the daemon in the order
        they were made, so that, say, a DeviceArray's free() or numpy() follows the
        task that uses it), at most the client's timeout (dspk.Timeout).  Not on the
        worker's thread nor the reading thread (whose callbacks may run meanwhile),
        and not for task.cancel."""
        if not self._jobs_pending or method == "task.cancel" or self._is_worker() or \
                self._is_reader() or getattr(self._tl, "deferring", False):
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._ensure_worker()
        with self._work_lock:
            while self._jobs_pending and self._closed is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _errors.Timeout(
                        "%s to dspkd at %s: the submit()s made before it were not sent "
                        "within %gs" % (method, self._socket_path, self.timeout))
                _wait_in(self._work_cond, _SEND_RECHECK if left is None
                         else min(left, _SEND_RECHECK))

    # ---- simple methods ----------------------------------------------------------

    @_public
    def ping(self, data: BytesLike = b"") -> float:
        """One round trip to the daemon's main loop; returns its time in seconds.
        ``data`` (any bytes-like object) is echoed back and checked; one that is not
        bytes-like is dspk.InvalidArgument, and a buffer of Python objects (a numpy
        array of dtype object: its bytes are this process's memory addresses)
        dspk.DtypeError, before anything is sent."""
        if type(data) is bytes and not data:  # the common case: nothing to echo
            t0 = time.perf_counter()
            echo = self._wait(self._start("ping", None, _decode_ping))  # (_call)
            dt = time.perf_counter() - t0
            if echo:
                raise _errors.ProtocolError("ping: the daemon echoed other data")
            return dt
        view = _byte_view("data", data, "pass bytes, or an array of numbers")
        data = view if view.c_contiguous else view.tobytes()  # a strided array's bytes
        bigs: List[memoryview] = []
        args = {"data": self._bin(data, bigs)} if memoryview(data).nbytes else None
        t0 = time.perf_counter()
        echo = self._call("ping", args, _decode_ping, bigs=bigs)
        dt = time.perf_counter() - t0
        if echo != memoryview(data).cast("B"):
            raise _errors.ProtocolError("ping: the daemon echoed other data")
        return dt

    @_public
    def devices(self, all: Flag = False) -> List[Dict[str, Any]]:
        """The daemon's devices (``{id, backend, name, type, arch, driver, uuid, memory,
        max_tensor_bytes, software, ops, kernel_langs}``, docs/protocol.md):
        ``max_tensor_bytes`` is the largest operand or result a task on the device can
        bind at any offset (a Vulkan device's maxStorageBufferRange less its
        minStorageBufferOffsetAlignment and one; ``memory`` elsewhere): a larger
        one is ``dspk.NotSupported``.
        With ``all=True``, backends without a usable device follow as
        ``{backend, reason}`` entries."""
        all = _flag("all", all)
        res = self._call("devices", {"all": True} if all else None, _decode_devices)
        self._learn_devices(res)
        out = list(res["devices"])
        if all:
            out += list(res["unavailable"])
        return out

    @_public
    def status(self) -> Dict[str, Any]:
        """The daemon's ``status``: ``{daemon, clients, devices}`` (docs/protocol.md)."""
        return self._call("status", None, _decode_map)

    @_public
    def cancel(self, future: concurrent.futures.Future) -> bool:
        """Asks the daemon to cancel the request of ``future`` (from :meth:`submit`);
        True when it was still in flight: the future then fails with dspk.Canceled when
        the work stopped, or holds its result when the work completed first."""
        owner = getattr(future, "_owner", None)
        if not isinstance(future, TaskFuture) or owner is None or owner() is not self:
            # Its msgid would name another request of this connection (they count
            # from 1 on every connection) and cancel that one.
            raise _errors.InvalidArgument("cancel: not a future of this connection's "
                                          "submit()")
        job = future._job
        if job is None and not future._msgid and future.done():
            return False  # a deferred submit() ended before its task was sent
        if job is not None:
            with self._work_lock:
                inner = job.inner
                if inner is None and not future.done():
                    job.stop = True  # the worker sends nothing more of it
            if inner is None:
                # Still with the worker: nothing of its task reached the daemon.
                if future.done():
                    return False
                self._settle(future, exc=_errors.Canceled(
                    "task canceled before it was sent"))
                return True
            future = inner
        return self._call("task.cancel", {"msgid": getattr(future, "msgid", 0)},
                          _decode_canceled)

    # ---- device buffers ----------------------------------------------------------

    def _handing(self, make: Callable[..., DeviceArray], *args: Any) -> DeviceArray:
        """The DeviceArray ``make(*args, claim)`` returns, handed over to the caller:
        its buffer is owned by a _Claim until the last step, which sets the claim
        handed and returns with no call in between (an interruption before drops the
        claim with the array, and the buffer is freed).  _public's work is done here,
        not by a wrapper: a wrapper's return is a point where a signal handler runs,
        after the hand-over and before the caller has the array."""
        tracer = sys.gettrace()
        if tracer is not None:
            sys.settrace(None)
        claim = _Claim()
        try:
            d = make(*(args + (claim,)))
        finally:
            if tracer is not None:
                sys.settrace(tracer)
        claim.ref.handed = True  # type: ignore[union-attr]  # no call: see _Claim
        return d

    def empty(self, shape: Integers, dtype: Any = np.float32,
              device: str = "any") -> DeviceArray:
        """An uninitialised DeviceArray (``buffer.create``), e.g. for ``out=``; ``dtype``
        anything ``numpy.dtype()`` takes that dspk has (float32 when not given; None is
        float64, as numpy has it)."""
        return self._handing(self._empty, shape, dtype, device)

    @_errors_as_dspk
    def _empty(self, shape: Integers, dtype: Any, device: str,
               claim: _Claim, deadline: Any = _EACH) -> DeviceArray:
        """empty(), its buffer owned by ``claim`` (the caller's) until handed over."""
        device = _device(device)
        shape_t = _shape(shape)
        dt = _dtype(dtype)
        nbytes = _nbytes(shape_t, dt, self._limits)
        res = self._new_buffer("buffer.create", {"device": device, "size": nbytes},
                               claim=claim, deadline=deadline)
        try:
            return DeviceArray(self, int(res["buffer"]), str(res["device"]), shape_t, dt,
                               size=int(res.get("size", nbytes)))
        except BaseException:  # a malformed answer, KeyboardInterrupt: no buffer left
            if isinstance(res, dict) and isinstance(res.get("buffer"), int):
                self._free_quietly(res["buffer"])
            raise

    def to_device(self, array: ArrayLike, device: str = "any") -> DeviceArray:
        """Copies ``array`` into a new daemon buffer on ``device`` (``"any"``: the daemon
        chooses) and returns it as a DeviceArray."""
        return self._handing(self._to_device, array, device)

    @_errors_as_dspk
    def _to_device(self, array: ArrayLike, device: str, claim: _Claim) -> DeviceArray:
        """to_device(), its buffer owned by ``claim`` (the caller's): an interruption
        anywhere before the caller hands the buffer over leaves it to the claim's free,
        a failure of the writes frees it here."""
        device = _device(device)
        a = _as_array(array, "array", self._limits)
        # One deadline for the whole call (its buffer.create and every chunk's write):
        # each bounded by the timeout on its own, a daemon stopped part-way made the
        # call take up to twice the timeout.
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        d = self._empty(a.shape, a.dtype, device, claim, deadline)
        try:
            self._write(d.buffer, 0, memoryview(a.reshape(-1).view(np.uint8)), deadline)
        except BaseException:
            # Freed without waiting (a free that waited for its answer took another
            # whole timeout after a Timeout): the claim, not handed over, frees the
            # buffer with the next request, or at once here when the send lock is
            # free (twice at worst: harmless).
            d._freed = True
            self._queue_free(d.buffer)
            claim.ref.handed = True  # type: ignore[union-attr]  # owed already
            raise
        return d

    @_public
    def empty_shared(self, shape: Integers, dtype: Any = np.float32,
                     device: str = "cpu:0") -> np.ndarray:
        """An uninitialised numpy array in memory shared with the daemon.

        The array lives in a memfd (sealed against shrinking and growing) that the daemon
        maps too (``buffer.import``): a view of it (the array itself, a slice, a
        reshape, a ``.view()`` of another dtype) that is C-contiguous, little-endian
        and starts at a multiple of its own item size from the array's first byte is
        sent as a reference to the daemon's buffer (its bytes are not copied; on
        ``cpu:0`` the daemon reads and writes these very pages).  As an operand, any
        other view (strided, big-endian, or starting off its item size, such as
        ``s[1:5].view(np.float64)`` of a float32 array) is sent as a copy, as a plain
        numpy array is; as ``out=`` it is dspk.InvalidArgument before anything is sent
        (so is one that is read-only).  The view pins the task to ``device``: another
        ``device=`` of the op, or an operand on another device, is
        dspk.InvalidArgument.  The daemon's buffer is freed when the array (and every view
        of it) is garbage collected (where the collection cannot send the free, with
        the client's next request), or when the connection closes; the array stays
        usable after that as ordinary memory.  A big-endian ``dtype`` is taken as its
        little-endian twin.  The memfd is closed once mapped: a shared array holds no
        file descriptor.  Zero elements give a 0-size shared array like any other (one
        byte is imported behind it: buffer.import refuses 0), usable as ``out=`` of a
        0-size result.

        Raises:
            dspk.LimitExceeded: no file descriptor to be had (EMFILE, ENFILE), or the
                daemon's limits; dspk.OutOfMemory: no memory for the memfd or the
                mapping; dspk.NotSupported: no memfd_create on this system (ENOSYS);
                dspk.PermissionDenied: memfd_create forbidden to this process (EPERM,
                EACCES: a seccomp filter) (and the other dspk.Error of buffer.import).
        """
        device = _device(device)
        shape_t = _shape(shape)
        dt = _dtype(dtype)
        # Not max_rank nor max_elements: a shared array is numpy memory too, and its
        # views of other shapes (a slice, a reshape) are the operands.
        nbytes = _nbytes(shape_t, dt)
        size = max(nbytes, 1)
        mm, view, buf, dev = self._import_memfd(device, size)
        try:
            try:
                arr = view[:nbytes].view(dt).reshape(shape_t)
            except (ValueError, TypeError) as e:  # numpy's: no such view of the bytes
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                raise _errors.InvalidArgument("empty_shared: shape %s of %s: %s"
                                              % (shape_t, dt, _errors._describe(e))) \
                    from None
            self._shared[buf] = (arr.__array_interface__["data"][0], size, dev)
            # Collected, the mapping owes the buffer.free by a C call alone (no Python
            # code, nothing a signal handler can cut), then _shared_gone sends it at
            # once if it can: weak references' callbacks run newest first.  A signal
            # handler's exception in _shared_gone is reported as ignored by Python,
            # and the free goes with the next request.
            weakref.finalize(mm, Client._shared_gone, weakref.ref(self))
            self._shared_refs[buf] = _SharedRef(mm, self._dead_shared.append, buf)
        except BaseException:  # no array: its buffer goes (KeyboardInterrupt too)
            # Whatever it is goes on as it is: numpy's refusal of the view is
            # InvalidArgument above, a MemoryError OutOfMemory (_public), and a signal
            # handler's exception (a TimeoutError, any Exception) the caller's own.
            self._shared.pop(buf, None)
            self._shared_refs.pop(buf, None)
            self._free_quietly(buf)
            raise
        return arr

    def _import_memfd(self, device: str, size: int) -> Tuple[Any, np.ndarray, int, str]:
        """A sealed memfd of ``size`` bytes, mapped here and imported by the daemon on
        ``device``: (mapping, its bytes, buffer id, device id).  An OSError of making
        or mapping it is the dspk.Error of _os_error."""
        try:
            f = _new_memfd()
        except OSError as e:
            if from_signal_handler(e):
                raise  # a signal handler's (a TimeoutError): the caller's, as it is
            raise _memfd_error(e) from None
        res = None
        try:
            try:
                try:
                    fd = f.fileno()
                    os.ftruncate(fd, size)
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
                    mm, view = _map_fd(fd, size)
                except OSError as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's (a TimeoutError): the caller's
                    raise _shm_size_error(size, e) from None
                res = self._new_buffer("buffer.import", {"device": device, "size": size},
                                       fds=[fd])
            finally:
                f.close()
            return mm, view, int(res["buffer"]), str(res["device"])
        except BaseException:  # KeyboardInterrupt after the answer: no buffer left
            if isinstance(res, dict) and isinstance(res.get("buffer"), int):
                self._free_quietly(res["buffer"])
            raise

    # ---- the automatic shared-memory path -----------------------------------------

    def _shared_device(self, target: str, op: str) -> Optional[str]:
        """The device of shared temporaries for a task on ``target``, or None (not
        cpu:0).  "any" counts only when the daemon has no hardware device: a shared
        buffer pins the task to its device, and "any" must stay free to choose."""
        if target == "cpu:0":
            return target
        if target != "any":
            return None
        if self._any_is_cpu is None:
            if getattr(self._tl, "deferring", False):
                # submit() waits for no answer: this task goes through the socket, and
                # the answer of a devices call sent now tells the next ones.
                self._ask_any_is_cpu()
                return None
            try:
                self._known_devices(op)
            except (_errors.Timeout, _errors.Closed):
                raise  # the daemon does not answer, or is gone: so would the socket
            except Error as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                return None
        return "cpu:0" if self._any_is_cpu else None

    def _learn_devices(self, res: Mapping[str, Any]) -> List[Dict[str, Any]]:
        """Keeps a (checked) devices answer's device list for the connection, and
        whether "any" is cpu:0 by it; returns the list."""
        devs = list(res["devices"])
        self._any_is_cpu = any(d.get("id") == "cpu:0" for d in devs) and \
            all(d.get("backend") == "cpu" or d.get("software") for d in devs)
        self._devs = devs
        return devs

    def _known_devices(self, op: str) -> List[Dict[str, Any]]:
        """The daemon's devices: those kept from an earlier answer, else asked now (a
        devices call, once per connection).  Its dspk.Timeout names the op it is a
        step of as well as the devices request."""
        devs = self._devs
        if devs is not None:
            return devs
        try:
            return self._learn_devices(self._call("devices", None, _decode_devices))
        except _errors.Timeout as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            raise _errors.Timeout("%s: the devices call that tells where its operands "
                                  "go: %s" % (op, e.message)) from None

    def _ask_any_is_cpu(self) -> None:
        """Sends a devices call, without waiting, whose answer sets _any_is_cpu."""
        if self._any_asking:
            return
        self._any_asking = True

        def learn(res: Any) -> None:
            self._learn_devices(res)

        def done(f: concurrent.futures.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self._any_asking = False  # asked again by a later call

        try:
            self._start("devices", None, lambda res: learn(_decode_devices(res)),
                        is_async=True)._add_inline(done)
        except (Error, _Defer) as e:  # _Defer: another thread sends; asked again later
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            self._any_asking = False

    def _task_device(self, op: str, inputs: Sequence[Any], options: Mapping[str, Any]
                     ) -> str:
        """The device "any" would choose for the task by protocol.md's rule, as far as
        the client can tell: among the devices that run it (``kernel_langs`` holding a
        kernel's ``lang``, ``ops`` holding the op for its first input's dtype) a
        hardware device, else cpu:0, else a software renderer; "any" when none does
        (the daemon's error then says why)."""
        if self._devs is None:
            self._no_wait()  # submit(): the devices call goes to the worker
        try:
            devs = self._known_devices(op)
            first = wire_name(_meta(inputs[0], "input 0")[1]) if inputs else None
        except (_errors.Timeout, _errors.Closed):
            raise  # the daemon does not answer, or is gone: the call ends with it
        except (Error, IndexError) as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            return "any"

        def runs(d: Mapping[str, Any]) -> bool:
            if op == "kernel":
                return options.get("lang") in (d.get("kernel_langs") or [])
            return first in ((d.get("ops") or {}).get(op) or [])

        def rank(d: Mapping[str, Any]) -> int:
            if d.get("software"):
                return 2
            return 1 if d.get("backend") == "cpu" else 0

        able = [d for d in devs if runs(d)]
        if not able:
            return "any"
        return str(min(able, key=rank).get("id"))

    def _temp_get(self, device: str, nbytes: int, into: _TempList,
                  make: bool = True) -> Optional[_Temp]:
        """An idle shared temporary of at least nbytes on device (the smallest that
        fits), or a new one (without ``make``: None, so that submit() never waits for
        the buffer.import round trip, which queues behind the device's earlier tasks);
        busy until _temp_put.  It is appended to ``into`` (the
        caller's list, which it gives to _temp_put on every path) in the same step
        that makes it busy, so that no interruption can leave it busy for good."""
        with self._temp_lock:
            gone = self._temp_reclaim_locked()
        self._temp_free(gone)
        with self._temp_lock:
            best = None
            for t in self._temps:
                if not t.busy and t.device == device and t.size >= nbytes and \
                        (best is None or t.size < best.size):
                    best = t
            if best is not None:
                best.busy = True
                best.held = into
                into.append(best)
                return best
            if not make:
                return None
            drop = self._temp_trim_locked(1)
        self._temp_free(drop)
        size = (nbytes + _TEMP_ROUND - 1) // _TEMP_ROUND * _TEMP_ROUND
        mm, view, buf, dev = self._import_memfd(device, size)
        try:
            t = _Temp(buf, dev, size, mm, view, into)
            with self._temp_lock:
                # Neither statement is a call: no signal handler runs between them.
                into += [t]
                self._temps += [t]
        except BaseException:  # KeyboardInterrupt: a temporary not kept is freed
            if not any(x.buffer == buf for x in self._temps):
                self._free_quietly(buf)
            raise
        return t

    def _temp_reclaim_locked(self) -> List[_Temp]:
        """Busy temporaries whose task's future is done although nothing gave them back
        (its _temps_done cut by an interruption as it started, or not run yet on the
        thread that completed it): idle again, or, the task canceled (it may still run
        in the daemon), dropped: returned, to be freed (_temp_free).  The future's
        state is read without its lock, which its completion holds while it calls
        _temps_done (that takes this one)."""
        drop = []
        for t in list(self._temps):
            done = t.held.done_with() if t.busy and t.held is not None else None
            if done is None:
                continue
            if done == 1:
                self._temp_idle_locked(t)
            else:
                self._temps.remove(t)
                drop.append(t)
        return drop

    def _temp_lend(self, t: _Temp, held: _TempList, dt: np.dtype,
                   shape: Tuple[int, ...]) -> Optional[np.ndarray]:
        """Lends temporary ``t`` (busy, held by ``held``, its task answered but its
        future not completed yet) to a result of ``dt`` and ``shape``: a writable
        C-contiguous array of its first bytes whose base is a _Lease, ``t`` held by the
        lease's _Lent until the last view is collected; None (the caller copies) once
        _TEMP_LENT_MAX temporaries are lent to results alive, once closed,
        or without a _Mapping (mmap.mmap, no ctypes).  The hand-over is one store
        under _temp_lock (no call between the check and it): an interruption before
        leaves ``t`` to ``held`` (idle once the future completes), one after drops the
        lease, and ``t`` is idle again at the next _temp_reclaim_locked."""
        mm = t.mm
        if not isinstance(mm, _Mapping) or math.prod(shape) * dt.itemsize <= 0:
            return None
        lease = _Lease(mm.region, mm.address, dt, shape)
        ref = _Lent(lease, self._lent_back.append)
        with self._temp_lock:
            if self._closed is not None or t.held is not held or \
                    sum(1 for x in self._temps
                        if isinstance(x.held, _Lent) and x.held() is not None) \
                    >= _TEMP_LENT_MAX:
                return None
            t.held = ref  # one store: no signal handler runs between it and the check
        return np.asarray(lease)

    def _temps_returned(self) -> None:
        """Results lent temporaries were collected (_lent_back): the temporaries are
        idle again, kept within the bounds (_temp_trim_locked) or freed, the free sent
        with the request that called this."""
        del self._lent_back[:]  # first: one collected after is noted again
        with self._temp_lock:
            gone = self._temp_reclaim_locked()
            gone += self._temp_trim_locked(0)
        self._temp_free(gone)

    def _temp_idle_locked(self, t: _Temp) -> None:
        t.busy = False
        t.held = None
        self._temp_clock += 1
        t.used = self._temp_clock

    def _temp_put(self, temps: Sequence[_Temp]) -> None:
        """``temps`` are idle again (their task is answered): kept for the next tasks
        within the bounds (_temp_trim_locked), the others freed at once.  Only those
        ``temps`` still holds: one given back before (_temp_reclaim_locked, or a put
        on another path) and taken by another task since stays that task's."""
        with self._temp_lock:
            for t in temps:
                if t.held is temps:
                    self._temp_idle_locked(t)
            drop = self._temp_trim_locked(0)
        self._temp_free(drop)
        if self._closed is not None:  # nothing reuses them now
            self._drop_temps_closed()

    def _drop_temps_closed(self) -> None:
        """Once closed: the idle temporaries' mappings go at once (as dspk_close
        unmaps libdspkclient's), not with the Client object; the daemon freed their
        buffers with the connection.  A busy one goes when its task is settled
        (_temp_put), a result's borrowed view keeping its pages until it goes.  One
        lent to a result (_Lent) goes out of the list now: the result's _Lease holds
        its mapping, unmapped once the last view of it is collected."""
        with self._temp_lock:
            drop = [t for t in self._temps if not t.busy or isinstance(t.held, _Lent)]
            for t in drop:
                self._temps.remove(t)
        for t in drop:
            t.view = t.mm = None

    def _temp_keep(self) -> int:
        """How many idle temporaries may be kept: _TEMP_IDLE_MAX, and no more than an
        eighth of the daemon's max_buffers (they count toward it)."""
        most = self._limits.get("max_buffers")
        if isinstance(most, int) and most > 0:
            return min(_TEMP_IDLE_MAX, most // 8)
        return _TEMP_IDLE_MAX

    def _temp_idle_bytes(self) -> int:
        """Bytes of idle temporaries that may be kept: _TEMP_IDLE_BYTES, and no more
        than an eighth of the connection's memory quota on cpu:0 (hello's
        cpu_memory_quota), which they count toward."""
        quota = self._limits.get("cpu_memory_quota")
        if isinstance(quota, int) and quota >= 0:
            return min(_TEMP_IDLE_BYTES, quota // _TEMP_IDLE_QUOTA)
        return _TEMP_IDLE_BYTES

    def _temp_trim_locked(self, room: int) -> List[_Temp]:
        """Takes out of _temps (the caller holds _temp_lock) the idle temporaries beyond
        the bounds, least recently used first, leaving room for ``room`` more idle
        ones: at most _temp_keep() idle ones of at most _temp_idle_bytes() together
        (one larger than that is never kept).  Returns them for _temp_free."""
        idle = sorted((t for t in self._temps if not t.busy), key=lambda t: -t.used)
        keep_n = max(0, self._temp_keep() - room)
        kept, total, drop = 0, 0, []
        for t in idle:  # the most recently used first
            if kept < keep_n and total + t.size <= self._temp_idle_bytes():
                kept += 1
                total += t.size
            else:
                drop.append(t)
        for t in drop:
            self._temps.remove(t)
        return drop

    def _temp_free(self, drop: Sequence[_Temp]) -> None:
        """Frees temporaries taken out of _temps (requests already sent still see
        them); their mapping goes once nothing refers to it."""
        for t in drop:
            t.view = t.mm = None
            self._free_quietly(t.buffer)

    def _queue_idle_temps_free(self) -> bool:
        """Takes every idle temporary out of the cache and queues its buffer.free
        (_temp_free: sent with the next request, or by whoever flushes); whether there
        was any.  Waits for nothing."""
        with self._temp_lock:
            gone = self._temp_reclaim_locked()  # results collected: their lent ones
        self._temp_free(gone)
        with self._temp_lock:
            drop = [t for t in self._temps if not t.busy]
            for t in drop:
                self._temps.remove(t)
        if not drop:
            return False
        self._temp_free(drop)
        return True

    def _drop_idle_temps(self) -> bool:
        """Frees every idle temporary now, the buffer.free sent before this returns
        (a refused allocation is then tried again); whether there was any."""
        if not self._queue_idle_temps_free():
            return False
        if self._dead_shared and not self._forked():
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            sl, token = self._send_lock, object()
            try:
                sl.claim(token, deadline, gone=self._gone)
                self._flush_frees_locked()
            except (_SendWaitTimeout, Error) as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, as it is
                pass  # not sent now: they go with a later request (or the connection)
            finally:
                if sl.owner is token:  # no call before the store: nothing can cut it
                    sl.owner = None
                    self._after_send()
        return True

    @staticmethod
    @_untraced
    def _shared_gone(ref: "weakref.ref[Client]") -> None:
        """A shared array was collected, its buffer.free owed already (_SharedRef):
        sends it now if the send lock is free (else the thread holding it does when it
        lets it go).  Runs inside garbage collection, maybe while this thread holds
        the client's locks: it never waits."""
        client = ref()
        if client is not None and client._closed is None and not client._forked():
            client._flush_frees()

    def _shared_ref(self, a: np.ndarray) -> Optional[Tuple[int, int, str]]:
        """(buffer, offset, device) when ``a`` is a C-contiguous array inside a shared
        array of this connection, else None."""
        if not self._shared or not a.flags.c_contiguous:
            return None
        addr = a.__array_interface__["data"][0]
        # A buffer whose array was collected is owed a free (its entry may not be
        # gone yet, and a new mapping may take its address): never referenced.
        dead = {_owed_buffer(x) for x in list(self._dead_shared)} \
            if self._dead_shared else ()
        for buf, (base, size, dev) in list(self._shared.items()):
            if buf in dead:
                continue
            if base <= addr and addr + a.nbytes <= base + size:
                return buf, addr - base, dev
        return None

    def _lent_ref(self, a: np.ndarray) -> Optional[Tuple[_Temp, _Lease, int]]:
        """(temporary, its lease, offset) when ``a`` is a C-contiguous view, at a
        multiple of its item size, inside a result this connection lent a temporary
        to and that is alive (its lease), else None.  ``a`` keeps its memory mapped
        and so does a lent temporary still listed: an address inside one is in it."""
        if not self._temps or not a.flags.c_contiguous or not _is_lent(a):
            return None
        addr = a.__array_interface__["data"][0]
        with self._temp_lock:
            for t in self._temps:
                held, mm = t.held, t.mm
                if not isinstance(held, _Lent) or not isinstance(mm, _Mapping):
                    continue
                lease = held()
                if lease is None or not (mm.address <= addr and
                                         addr + a.nbytes <= mm.address + t.size):
                    continue
                off = addr - mm.address
                if off % max(a.dtype.itemsize, 1):
                    return None  # protocol.md: a reference at a multiple of it only
                return t, lease, off
        return None

    def _piece(self, nbytes: int, framing: int, method: str) -> int:
        """Bytes of data in one ``method`` piece of a transfer of ``nbytes``: what the
        daemon's max_message leaves beside the framing.  None at all (a max_message of
        64 bytes or less) is dspk.LimitExceeded before anything is sent."""
        step = self.max_message - framing
        if step <= 0 and nbytes:
            raise _errors.LimitExceeded(
                "%s: the daemon's max_message (%d bytes) leaves no room for data in a "
                "%s (more than %d bytes needed)"
                % (method, self.max_message, method + (" answer" if method == "buffer.read"
                                                        else " request"), framing))
        return max(step, 1)

    def _write(self, buffer: int, offset: int, view: memoryview,
               deadline: Any = _EACH) -> None:
        """buffer.write in chunks below max_message, pipelined, then all answers.  When
        sending a chunk fails (an interruption, dspk.Timeout), the chunks already sent
        are not waited for: that exception propagates as it is (waiting there could
        raise another, dspk.Closed of a connection the failure closed, in its place);
        their answers are dropped as they come."""
        step = self._piece(view.nbytes, _WRITE_FRAMING, "buffer.write")
        futs = []
        for pos in range(0, view.nbytes, step):
            bigs: List[memoryview] = []
            data = self._bin(view[pos:pos + step], bigs)
            futs.append(self._start("buffer.write", {"buffer": buffer,
                                                     "offset": offset + pos,
                                                     "data": data}, bigs=bigs,
                                    deadline=deadline))
        for f in futs:
            self._wait(f, deadline)

    def _start_reads(self, buffer: int, offset: int, flat: np.ndarray,
                     is_async: bool = False) -> List[TaskFuture]:
        """buffer.read requests filling ``flat`` (uint8), each at most max_message - 64
        bytes as protocol.md requires; their futures complete when their piece is in."""
        step = self._piece(flat.nbytes, _READ_FRAMING, "buffer.read")
        futs = []
        for pos in range(0, flat.nbytes, step):
            n = min(step, flat.nbytes - pos)

            def fill(res: Any, pos: int = pos, n: int = n) -> None:
                _want(res, "map", "result")
                if "data" not in res and res.get("size") == n:
                    return  # received in place (_take_direct)
                data = _field(res, "data", "bin")
                if len(data) != n:
                    raise _Malformed("result.data is %d bytes, not the %d asked"
                                     % (len(data), n))
                flat[pos:pos + n] = np.frombuffer(data, np.uint8)

            into = memoryview(flat[pos:pos + n]) if n >= _DIRECT_MIN else None
            futs.append(self._start("buffer.read", {"buffer": buffer, "offset": offset + pos,
                                                    "size": n}, fill, is_async=is_async,
                                    into=into))
        return futs

    def _read_array(self, d: DeviceArray) -> np.ndarray:
        out = np.empty(d.shape, dtype=d.dtype)
        futs = self._start_reads(d.buffer, d._offset, out.reshape(-1).view(np.uint8))
        for f in futs:
            self._wait(f)
        return out

    def _free_buffer(self, buffer: int) -> None:
        self._call("buffer.free", {"buffer": buffer})

    # ---- tasks -------------------------------------------------------------------

    def _task_request(self, op: str, inputs: Sequence[ArrayLike], options: Dict[str, Any],
                      device: str, out: Optional[OutArg], shm: _TempList,
                      is_async: bool = False, shared: bool = True
                      ) -> Tuple[Dict[str, Any], List[memoryview], List[int],
                                 Callable[[Any], Any], str]:
        """The task.run request of an op: (args, payloads spliced in by _encode,
        temporary buffers staging operands (the caller frees them), the decoder of
        the answer, the device the task is pinned to or "any").  The shared
        temporaries it takes go into ``shm``, which the caller gives back (_temp_put)
        on every path, an exception of this method's included."""
        bigs: List[memoryview] = []
        temps = _Staged()
        tensors: List[Dict[str, Any]] = []
        inline: List[Tuple[np.ndarray, Dict[str, Any]]] = []
        target = device
        # out= first: like a DeviceArray or shared operand it pins the task to its
        # device, and that device decides where operands are staged.
        out_shared = None
        outputs = None
        pinned: List[Tuple[str, str]] = []  # (device, what pinned it), the first kept

        def pin(dev: str, what: str) -> None:
            # A buffer reference pins the task to the buffer's device: another device=,
            # or another operand's device, would be the daemon's EINVAL naming neither
            # the operand nor device= ("the task asks for vulkan:0 but its buffers are
            # on cpu:0"): refused here, naming both, before anything is sent.
            if device != "any" and dev != device:
                raise _errors.InvalidArgument(
                    "%s is on %s, but device=%r: a DeviceArray or a shared array pins the "
                    "task to its own device (pass device=%r, or \"any\")"
                    % (what, dev, device, dev))
            if pinned and pinned[0][0] != dev:
                raise _errors.InvalidArgument(
                    "%s is on %s, but %s is on %s: the operands and out= of one task must "
                    "be on one device" % (what, dev, pinned[0][1], pinned[0][0]))
            if not pinned:
                pinned.append((dev, what))
        if out is not None:
            if isinstance(out, (np.ma.MaskedArray, np.matrix)):
                # The daemon would write the data under a mask it leaves as it was, or
                # a result of another shape than the matrix's (as_ndarray's operands).
                raise _errors.InvalidArgument(
                    "out=: a %s (a plain numpy array takes a result: a shared array, or "
                    "a C-contiguous slice of one)" % ("numpy.ma.MaskedArray" if isinstance(
                        out, np.ma.MaskedArray) else "numpy.matrix"))
            if isinstance(out, np.ndarray):
                if _is_lent(out):
                    # The real reason first: no view of a lent result takes one.
                    raise _errors.InvalidArgument(_out_refusal(out))
                # The daemon writes the result in one piece, into memory the caller
                # may write: a strided view or a read-only one would be overwritten
                # wrongly (numpy refuses both as out= of its ufuncs too).
                if not out.flags.c_contiguous:
                    raise _errors.InvalidArgument("out=: the array is not C-contiguous (a "
                                                  "shared array, or a C-contiguous slice "
                                                  "of one, takes a result)")
                if not out.flags.writeable:
                    raise _errors.InvalidArgument("out=: the array is read-only")
                ref = self._shared_ref(out)
                if ref is None and _in_mapping(out):
                    raise _errors.InvalidArgument(
                        "out=: a shared array of another Client (or of a closed one): its "
                        "memory is imported into that client's connection only; pass it "
                        "to an op of that client, or use a shared array of this one")
                if ref is None:
                    raise _errors.InvalidArgument(_out_refusal(out))
                if out.dtype.byteorder == ">":
                    raise _errors.InvalidArgument("out=: dtype %s is big-endian (the daemon "
                                                  "writes little-endian)" % out.dtype)
                if ref[1] % max(out.dtype.itemsize, 1):
                    raise _errors.InvalidArgument(
                        "out=: the view starts at byte %d of its shared array, not a "
                        "multiple of its item size (%d), where the daemon cannot write a "
                        "result" % (ref[1], out.dtype.itemsize))
                pin(ref[2], "out= (a shared array)")
                out_shared = out
                outputs = [{"buffer": ref[0], "offset": ref[1]}]
                out = None
                if target == "any":
                    target = ref[2]
            elif isinstance(out, DeviceArray) and out.client is not self:
                raise _errors.InvalidArgument(_foreign_array("out=", out))
            elif not isinstance(out, DeviceArray):
                raise _errors.InvalidArgument(_out_refusal(out))
            else:
                out._live("out=")
                pin(out.device, "out= (a DeviceArray)")
                outputs = [{"buffer": out.buffer, "offset": out._offset}]
                if target == "any":
                    target = out.device
        for i, x in enumerate(inputs):
            if isinstance(x, DeviceArray) and x.client is not self:
                raise _errors.InvalidArgument(_foreign_array("input %d" % i, x))
            if isinstance(x, DeviceArray):
                x._live("input %d" % i)
        # Operands the daemon's op would refuse: its error, before any is sent.
        refused = _op_refusal(op, inputs, options, self._limits)
        if refused is not None:
            try:
                raise refused
            finally:
                refused = None  # see _no_cycle
        if outputs is not None:
            # out= must hold the result (protocol.md: ERANGE before any work).  The
            # daemon bounds the result by the out= buffer only, and a view (a slice of a
            # shared array, a DeviceArray inside its buffer) is less: refused here.
            room = (out_shared if out_shared is not None else out).nbytes
            meta = _result_meta(op, inputs, options)
            rdt = _result_dtype(op, inputs, options)
            dest = out_shared if out_shared is not None else out
            if meta is not None and not _over_limit(meta[0], self._limits) and \
                    math.prod(meta[0]) * meta[1] > room:
                raise _errors.RangeError(
                    "out=: the result (%s %s, %d bytes) does not fit the %d bytes of "
                    "out= (%s %s)" % (wire_name(rdt) if rdt is not None else "shape",
                                      tuple(meta[0]), math.prod(meta[0]) * meta[1], room,
                                      _dt_text(dest.dtype), tuple(dest.shape)))
            # One that fits but is of another shape or dtype would be written and then
            # refused: refused before anything is sent.
            if meta is not None and rdt is not None and \
                    not _over_limit(meta[0], self._limits) and \
                    (tuple(meta[0]) != tuple(dest.shape) or rdt != dest.dtype):
                raise _errors.InvalidArgument(
                    "out=: the result is %s %s, out= is %s %s" % (
                        wire_name(rdt), tuple(meta[0]), _dt_text(dest.dtype),
                        tuple(dest.shape)))
        # Shared operands: (buffer, offset, the array), so that kernel() gives them back.
        shared_ops: List[Tuple[int, int, np.ndarray]] = []
        # kernel: its results are its inputs in order, so result i is the very object
        # passed as input i (two views of the same bytes stay two objects).
        by_pos: Dict[int, Union[DeviceArray, np.ndarray]] = {}
        for i, x in enumerate(inputs):
            if isinstance(x, DeviceArray):
                if x.client is not self:
                    raise _errors.InvalidArgument(_foreign_array("input %d" % i, x))
                pin(x.device, "input %d (a DeviceArray)" % i)
                tensors.append(x._ref())
                by_pos[i] = x
                if target == "any":
                    target = x.device
            else:
                a = _as_array(x, "input %d" % i, self._limits)
                t: Dict[str, Any] = {"dtype": wire_name(a.dtype), "shape": list(a.shape)}
                tensors.append(t)
                ref = self._shared_ref(a)
                # A view that starts off its item size (s[1:5].view(np.float64) of a
                # float32 array) cannot be referenced (protocol.md): sent as a copy.
                if ref is not None and ref[1] % max(a.dtype.itemsize, 1) == 0:
                    pin(ref[2], "input %d (a shared array)" % i)
                    t["buffer"], t["offset"] = ref[0], ref[1]
                    shared_ops.append((ref[0], ref[1], a))
                    by_pos[i] = a
                    if target == "any":
                        target = ref[2]
                    continue
                inline.append((a, t))
        try:
            # A lent result of this connection (or a C-contiguous view of it) as an
            # operand of a synchronous op that goes to its temporary's device anyway
            # (cpu:0): a reference to that temporary, which the daemon reads in
            # place, as a shared array (no copy; it pins nothing the task was not
            # pinned to).  Not in submit(), whose caller may write its operands
            # once it returns, nor for kernel, whose inputs come back.
            if inline and not is_async and op != "kernel" and self.shared_threshold:
                lent = [(a, t, r) for a, t in inline for r in (self._lent_ref(a),)
                        if r is not None]
                ldev = self._shared_device(target, op) if lent else None
                for a, t, (tmp, lease, off) in lent:
                    if tmp.device == ldev:
                        shm.leases.append(lease)  # before the reference: see _TempList
                        t["buffer"], t["offset"] = tmp.buffer, off
                        if target == "any":
                            target = ldev
                inline = [(a, t) for a, t in inline if "buffer" not in t]
            # Large operands on cpu:0: copied once into shared temporaries that the
            # daemon reads in place, instead of crossing the socket (and being copied
            # again on the daemon's side).  Not for kernel, whose inputs come back.
            big = [(a, t) for a, t in inline
                   if shared and self.shared_threshold and a.nbytes >= self.shared_threshold]
            sdev = self._shared_device(target, op) if big and op != "kernel" else None
            if sdev is not None:
                try:
                    for a, t in big:
                        tmp = self._temp_get(sdev, a.nbytes, shm, make=not is_async)
                        if tmp is None:
                            continue  # submit(): no idle one, inline rather than wait
                        _copy_wide(tmp.view[:a.nbytes], a.reshape(-1).view(np.uint8))
                        t["buffer"], t["offset"] = tmp.buffer, 0
                except (_errors.Timeout, _errors.Closed):
                    raise  # the daemon does not answer, or is gone: so would the socket
                except Error as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's: the caller's, as it is
                    # No shared memory to be had (a limit, no descriptor, a quota): the
                    # op is made again through the socket (_run), once the temporaries
                    # made for it, which count toward the same limits, are freed.
                    raise _NoShared() from None
                if shm:
                    inline = [(a, t) for a, t in inline if "buffer" not in t]
                    target = sdev
            total = sum(a.nbytes for a, _ in inline)
            # A message must stay below max_message: the largest operands of one that
            # would not go through temporary buffers (freed once the task is sent, or,
            # for kernel, once its tensors are read back).
            for a, t in sorted(inline, key=lambda p: -p[0].nbytes):
                if total + _HEADROOM <= self.max_message:
                    break
                self._no_wait()  # submit(): staged by the worker, which waits
                if target == "any":
                    # A temporary buffer pins the task to its device: one that runs
                    # the task (a kernel's language, the op on its first input's
                    # dtype), not the daemon's choice for a bare buffer.
                    target = self._task_device(op, inputs, options)
                claim = _Claim()  # owns the buffer as long as temps (see _Staged)
                d = self._to_device(a, target, claim)
                temps.claims[d.buffer] = claim
                temps.append(d.buffer)
                target = d.device
                total -= a.nbytes
                t.update(d._ref())
        except BaseException:
            for b in temps:
                self._free_quietly(b)
            raise
        for a, t in inline:
            if "buffer" not in t:
                t["data"] = self._bin(a.reshape(-1).view(np.uint8), bigs)
        args: Dict[str, Any] = {"op": op, "device": device, "inputs": tensors}
        if options:
            args["options"] = options
        if outputs is not None:
            args["outputs"] = outputs
        operands = [x for x in inputs if isinstance(x, DeviceArray)]

        def decode(res: Any, first: int = 0) -> Any:
            """The results of answer ``res``, its outputs being the results from
            position ``first`` on."""
            outs = res.get("outputs", [])
            if isinstance(out, DeviceArray) and outs:
                t = outs[0]
                if numpy_dtype(t["dtype"]) != out.dtype or \
                        tuple(int(n) for n in t["shape"]) != out.shape:
                    raise _errors.InvalidArgument(
                        "out=: the result is %s %s, the DeviceArray %s %s (its bytes were "
                        "overwritten)" % (t["dtype"], tuple(t["shape"]), _dt_text(out.dtype),
                                          out.shape))
            if out_shared is not None and outs:
                t = outs[0]
                if numpy_dtype(t["dtype"]) != out_shared.dtype or \
                        tuple(int(n) for n in t["shape"]) != out_shared.shape:
                    raise _errors.InvalidArgument(
                        "out=: the result is %s %s, the shared array %s %s (its bytes were "
                        "overwritten)" % (t["dtype"], tuple(t["shape"]),
                                          _dt_text(out_shared.dtype), out_shared.shape))
                return [out_shared] + [self._decode_tensor(t, operands, shared_ops, None)
                                       for t in outs[1:]]
            return [self._decode_tensor(t, operands, shared_ops, out,
                                        by_pos.get(k) if op == "kernel" else None)
                    for k, t in enumerate(outs, first)]

        return args, bigs, temps, decode, target

    def _decode_tensor(self, t: Mapping[str, Any], operands: Sequence[DeviceArray],
                       shared_ops: Sequence[Tuple[int, int, np.ndarray]],
                       out: Optional[OutArg],
                       passed: Union[None, DeviceArray, np.ndarray] = None
                       ) -> Union[np.ndarray, DeviceArray]:
        """One tensor of an answer: inline data as a new numpy array; a reference as the
        DeviceArray (``out``, ``operands``) or shared array (``shared_ops``) it names:
        ``passed``, the object passed at its position (kernel), when it names that."""
        dt = numpy_dtype(t["dtype"])
        shape = tuple(int(n) for n in t["shape"])
        if "buffer" in t and t.get("data") is None:
            offset = int(t.get("offset") or 0)
            if isinstance(passed, DeviceArray) and passed.buffer == t["buffer"] and \
                    passed._offset == offset and passed.shape == shape and passed.dtype == dt:
                return passed
            if isinstance(passed, np.ndarray) and passed.shape == shape and \
                    passed.dtype == dt and any(buf == t["buffer"] and off == offset and
                                               arr is passed for buf, off, arr in shared_ops):
                return passed
            for cand in ([out] if out is not None else []) + list(operands):
                if cand.buffer == t["buffer"] and cand._offset == offset \
                        and cand.shape == shape and cand.dtype == dt:
                    return cand
            for buf, off, arr in shared_ops:
                if buf == t["buffer"] and off == offset and arr.shape == shape \
                        and arr.dtype == dt:
                    return arr
            owner = out or next((o for o in operands if o.buffer == t["buffer"]), None)
            if owner is None:
                raise _Malformed("a result in buffer %s, which no operand names"
                                 % t["buffer"])
            return DeviceArray(self, int(t["buffer"]), owner.device, shape, dt, offset)
        data = t["data"]
        n = math.prod(shape)
        if len(data) != n * dt.itemsize:
            raise _errors.ProtocolError("result of %d bytes for shape %s %s"
                                        % (len(data), shape, _dt_text(dt)))
        # A writable array: numpy refuses to write into the bytes object msgpack made.
        return np.frombuffer(data, dtype=dt, count=n).reshape(shape).copy()

    def _run(self, op: str, inputs: Sequence[ArrayLike], options: Dict[str, Any],
             device: str, out: Optional[OutArg], single: bool = True,
             progress: Optional[Progress] = None, is_async: bool = False,
             shared: bool = True) -> TaskFuture:
        """Sends the op's task; its future.  ``shared``: the automatic shared-memory
        path may be taken.  When it cannot be had (a temporary refused), or a
        synchronous call's task that took it is refused with ELIMIT (the temporaries,
        whole 2 MiB each, count toward the quotas that refused it), the temporaries are
        freed and the op is made again through the socket: the documented fallback
        never fails for what the temporaries themselves hold."""
        device = _device(device)  # every op's, submit()'s too: checked before anything
        if self._forked():  # before the temporaries' lock, which a fork may leave held
            raise self._fork_error()
        owner: List[TaskFuture] = []
        shm = _TempList(owner)
        again = functools.partial(self._run, op, inputs, options, device, out, single,
                                  progress, is_async, shared=False)
        try:
            args, bigs, temps, decode, target = self._task_request(op, inputs, options,
                                                                   device, out, shm,
                                                                   is_async, shared)
            if is_async:
                self._trim_for_submit(op, inputs, options, out, args, target)
            fut = self._run_request(op, inputs, options, out, single, progress, is_async,
                                    args, bigs, temps, decode, target, shm, owner, shared)
        except _NoShared:  # nothing of the task was sent
            shm.ended = True
            self._temp_put(shm)
            self._drop_idle_temps()
            return again()
        except BaseException:
            shm.ended = True  # before any call: see _TempList
            sent = [f for f in owner if f._sent]
            if sent and (shm or shm.leases):
                # The task went out (an interruption came after): its temporaries
                # stay busy until it is answered.
                shm.fut = sent[-1]
                sent[-1]._add_inline(lambda f: self._temps_done(f, shm))
            else:
                self._temp_put(shm)
            raise
        if shm or shm.leases:
            shm.fut = fut  # one store: no signal handler runs before or after it
            fut._add_inline(lambda f: self._temps_done(f, shm))
        if not is_async and shared:
            # (shared: not once more for a call that is this rule's second try)
            try:
                self._wait(fut)
            except _errors.LimitExceeded as e:
                if from_signal_handler(e):
                    raise  # a signal handler's: the caller's, not the daemon's refusal
                # Refused before it ran (a quota, max_buffers) while it held shared
                # temporaries, or while the connection held idle ones, which count
                # toward the same quotas: through the socket, with the idle
                # temporaries freed first.  (_temps_done may not have run yet on the
                # thread that read the answer: putting the temporaries back twice
                # does no harm.)
                if shm:
                    self._temp_put(shm)
                if not self._drop_idle_temps() and not shm:
                    raise
                return again()
        return fut

    def _trim_for_submit(self, op: str, inputs: Sequence[ArrayLike],
                         options: Mapping[str, Any], out: Optional[OutArg],
                         args: Mapping[str, Any], target: str) -> None:
        """submit() cannot send its task again once refused (the caller may write its
        arrays as soon as submit() returns), nor wait for a free's answer: so before
        its task goes, when the task's memory on cpu:0 (its inline operands and its
        result, as the daemon's quotas count them) and the idle shared temporaries
        (on cpu:0 too) together pass the connection's memory quota there (hello's
        cpu_memory_quota), the idle temporaries are freed, their buffer.free sent
        before the task (_queue_free: the send lock is this thread's next, or the
        frees go first with the task's request), so that the daemon never refuses it
        for what the client's own cache holds.  Without waiting for anything."""
        quota = self._limits.get("cpu_memory_quota")
        if not isinstance(quota, int) or quota < 0 or target not in ("any", "cpu:0"):
            return
        with self._temp_lock:
            gone = self._temp_reclaim_locked()  # results collected: their lent ones
            idle = sum(t.size for t in self._temps if not t.busy)
        self._temp_free(gone)
        if not idle:
            return
        need = 0
        for t in args.get("inputs", ()):
            if isinstance(t, dict) and "data" in t:  # inline (a bin, or its placeholder)
                need += numpy_dtype(t["dtype"]).itemsize * math.prod(t["shape"])
        if "outputs" not in args:
            try:
                need += _result_bound(op, inputs, options, self._limits) or 0
            except Exception as e:  # noqa: BLE001 - checked before: no bound to add
                if from_signal_handler(e):
                    raise
        if need + idle > quota:
            self._queue_idle_temps_free()

    def _temps_done(self, fut: concurrent.futures.Future, shm: _TempList) -> None:
        """The task of ``fut`` is answered: its temporaries are free for the next.  A
        canceled one may still run on the daemon: its temporaries are dropped.  Then
        ``shm`` lets go of the futures (none of its temporaries is held by it now):
        the future holds this callback, which holds ``shm``, and that cycle kept the
        future, and the result lent a temporary (_temp_lend), alive until a garbage
        collection, the temporary busy meanwhile."""
        if not fut.cancelled():
            self._temp_put(shm)
        else:
            with self._temp_lock:
                mine = [t for t in shm if t.held is shm and t in self._temps]
                # The lent results it reads likewise: their temporaries are given up
                # (never reused; the results keep their pages, as after close()).
                mine += [t for t in self._temps if isinstance(t.held, _Lent) and
                         any(t.held() is lease for lease in shm.leases)]
                for t in mine:
                    self._temps.remove(t)
                    if t.held is shm:
                        t.held = None  # (a cycle with shm: see below)
            self._temp_free(mine)
            del shm[:]
        shm.fut = None
        shm.owner = []
        shm.leases = []

    def _run_request(self, op: str, inputs: Sequence[ArrayLike], options: Dict[str, Any],
                     out: Optional[OutArg], single: bool, progress: Optional[Progress],
                     is_async: bool, args: Dict[str, Any], bigs: List[memoryview],
                     temps: List[int], decode: Callable[[Any], Any], target: str,
                     shm: _TempList, owner: Optional[List[TaskFuture]] = None,
                     shared: bool = True) -> TaskFuture:
        """Sends the task and returns its future.  It owns ``temps``: on every path
        they are freed, once the task is sent (requests already sent still see
        them), or by the staged future that reads them back."""
        count, expect = self._task_expect(op, inputs, options, out)

        def result(res: Any) -> Any:
            _task_outputs(res, count, expect)
            outs = decode(res)
            return outs[0] if single else outs

        free_now = list(temps)
        try:
            bound = None
            if out is None and "outputs" not in args and single:
                bound = _result_bound(op, inputs, options, self._limits)
            sdev = None
            if shared and bound is not None and self.shared_threshold and \
                    bound >= self.shared_threshold and op != "kernel":
                sdev = self._shared_device(target, op)
            rt = None
            if sdev is not None:
                try:
                    rt = self._temp_get(sdev, bound, shm, make=not is_async)
                except (_errors.Timeout, _errors.Closed):
                    raise  # the daemon does not answer, or is gone: so would the socket
                except Error as e:
                    if from_signal_handler(e):
                        raise  # a signal handler's: the caller's, as it is
                    # No shared memory to be had: the op is made again through the
                    # socket (_run), the operands' temporaries freed first.
                    raise _NoShared() from None
            if rt is not None:
                # A large result on cpu:0: written by the daemon into a shared
                # temporary (no socket, no unpacking), lent to the array returned (a
                # view of it, _temp_lend) or, past _TEMP_LENT_MAX, copied from there.
                args["outputs"] = [{"buffer": rt.buffer, "offset": 0}]

                def from_temp(res: Any) -> Any:
                    t = _task_outputs(res, count, expect)[0]
                    dt, shape = _tensor_meta(t, "result.outputs[0]")
                    nbytes = math.prod(shape) * dt.itemsize
                    if t.get("buffer") != rt.buffer or nbytes > rt.size:
                        raise _Malformed("result.outputs[0] (%s %s) is not in its "
                                         "temporary (buffer %d)"
                                         % (wire_name(dt), shape, rt.buffer))
                    lent = self._temp_lend(rt, shm, dt, shape)
                    if lent is not None:
                        return lent
                    arr = np.empty(shape, dt)
                    _copy_wide(arr.reshape(-1).view(np.uint8), rt.view[:arr.nbytes])
                    return arr

                self._no_wait(always=False)  # earlier submit()s' tasks go first
                return self._start("task.run", args, from_temp, progress, is_async, bigs,
                                   owner=owner)
            if bound is not None and bound > self.max_message - _RESULT_FRAMING:
                # Too large to come back inline (protocol.md, Limits): into a temporary
                # buffer, read back in pieces.
                self._no_wait()  # submit(): the worker makes it, and waits
                claim = _Claim()  # owns it until the staged future does (see _Staged)
                res = self._new_buffer("buffer.create", {"device": target, "size": bound},
                                       claim=claim)
                tmp = int(res["buffer"])
                free_now.append(tmp)
                mine = _Staged()
                mine.claims[tmp] = claim
                mine.append(tmp)
                args["outputs"] = [{"buffer": tmp, "offset": 0}]
                fut = self._start_staged(args, bigs, mine, decode, single, progress,
                                         is_async, (count, expect))
                free_now.remove(tmp)
                return fut
            if op == "kernel" and temps:
                # Tensors staged through temporary buffers come back as numpy arrays,
                # as inline ones do: read back before the buffers are freed.
                fut = self._start_staged(args, bigs, temps, decode, single,
                                         progress, is_async, (count, expect))
                free_now = []
                return fut
            self._no_wait(always=False)  # earlier submit()s' tasks go first
            return self._start("task.run", args, result, progress, is_async, bigs,
                               owner=owner)
        finally:
            for b in free_now:
                self._free_staged(temps, b)

    @staticmethod
    def _task_expect(op: str, inputs: Sequence[ArrayLike], options: Mapping[str, Any],
                     out: Optional[OutArg]) -> Tuple[int, Optional[_Expect]]:
        """What task.run's answer must hold (_task_outputs): how many outputs and of
        which dtype and shape: a kernel's every tensor as it was passed; an op's one
        result, without out= (whose own checks say more), where the client computes
        it."""
        if op == "kernel":
            try:
                metas = [_meta(x, "tensor %d" % i) for i, x in enumerate(inputs)]
            except Exception as e:  # noqa: BLE001 - refused before: nothing to expect
                if from_signal_handler(e):
                    raise
                return len(inputs), None
            return len(inputs), (op, [(dt.newbyteorder("<") if dt.byteorder == ">" else dt,
                                       shape) for shape, dt in metas])
        meta = _result_meta(op, inputs, options) if out is None else None
        dt = _result_dtype(op, inputs, options) if meta is not None else None
        return 1, (op, [(dt, meta[0])]) if meta is not None and dt is not None else None

    def _start_staged(self, args: Dict[str, Any], bigs: List[memoryview], staged: List[int],
                      decode: Callable[[Any], Any], single: bool,
                      progress: Optional[Progress], is_async: bool,
                      check: Tuple[int, Optional[_Expect]] = (1, None)) -> TaskFuture:
        """task.run with tensors in temporary buffers ``staged``; the future returned
        gets the results (those in ``staged`` read back as numpy arrays, the others as
        ``decode`` makes them) once every buffer.read is in.  Once the task is sent the
        future owns ``staged``: they are freed once, however it ends (its result, an
        error, cancel(), the connection closing); if sending fails, the caller frees
        them."""
        user = TaskFuture()
        user._owner = weakref.ref(self)
        inner = self._start("task.run", args, None, progress, is_async, bigs)
        user._msgid = inner.msgid
        user._via = inner
        lock = threading.Lock()

        def release() -> None:
            # Each buffer once (see _free_staged), also where this runs again after an
            # interruption cut it (see _add_inline): a flag set before the frees left
            # those after the cut to the claims, freed only once the closures holding
            # the list were collected.
            for b in staged:  # requests already sent still see them
                self._free_staged(staged, b)

        def finish(value: Any = None, exc: Optional[BaseException] = None) -> None:
            release()
            self._settle(user, value, exc)

        def on_task(f: concurrent.futures.Future) -> None:
            if f.cancelled():
                finish(exc=_errors.Canceled("task canceled"))
                return
            if f.exception() is not None:
                finish(exc=f.exception())
                return
            try:
                results: List[Any] = []
                reads: List[TaskFuture] = []
                outs = _task_outputs(f.result(), *check)
                for k, t in enumerate(outs):
                    if t.get("data") is None and t.get("buffer") in staged:
                        dt, shape = _tensor_meta(t, "result.outputs[%d]" % k)
                        arr = np.empty(shape, dt)
                        reads += self._start_reads(int(t["buffer"]),
                                                   int(t.get("offset") or 0),
                                                   arr.reshape(-1).view(np.uint8), is_async)
                        results.append(arr)
                    else:
                        results.append(decode({"outputs": [t]}, k)[0])
                value = results[0] if single else results
            except BaseException as e:  # noqa: BLE001 - the caller's future gets it
                if not isinstance(e, Exception) and _on_main():
                    # A signal handler's exception, the main thread reading: not the
                    # task's outcome.  It propagates; this callback runs again with
                    # the next attempt to settle the task's future (see _add_inline).
                    raise
                err = _as_error(e)
                if isinstance(e, _Malformed):
                    err = _errors.ProtocolError("task.run (request %d): a malformed "
                                                "answer: %s" % (inner.msgid, e))
                elif isinstance(err, Exception) and not isinstance(err, Error):
                    err = _errors.ProtocolError("task.run (request %d): a malformed "
                                                "answer (%s)" % (inner.msgid,
                                                                 _errors._describe(e)))
                finish(exc=err)
                err = None  # see _no_cycle
                return
            left = [len(reads)]
            counted: Set[int] = set()

            def on_read(rf: concurrent.futures.Future) -> None:
                # Run again where an interruption cut it (see _add_inline): each read
                # is counted once, and finish() may run twice.
                e = _errors.Canceled("read canceled") if rf.cancelled() else rf.exception()
                if e is not None:
                    finish(exc=e)
                    return
                with lock:
                    counted.add(id(rf))  # (twice: once)
                    last = len(counted) == left[0]
                if last:
                    finish(value=value)

            if not reads:
                finish(value=value)
            for rf in reads:
                rf._add_inline(on_read)

        def on_user(u: concurrent.futures.Future) -> None:
            if u.cancelled():
                inner.cancel()
                release()  # at once: the reads may still be in flight

        inner._add_inline(on_task)
        user._add_inline(on_user)
        return user

    def _free_quietly(self, buffer: int) -> None:
        """Frees a temporary without waiting (see _queue_free)."""
        self._queue_free(buffer)

    def _free_staged(self, staged: List[int], buffer: int) -> None:
        """Frees a staged operand's temporary without waiting, unless its claim (see
        _Staged) says its free is owed already; the claim is set handed once it is."""
        claim = staged.claims.get(buffer) if isinstance(staged, _Staged) else None
        if claim is not None and claim.ref is not None and claim.ref.handed:
            return
        self._queue_free(buffer)
        if claim is not None and claim.ref is not None:
            claim.ref.handed = True

    # Each op builds its request in _op_<name> and returns the future; the public
    # methods wait for it, submit() hands it out.

    def _op_gemm(self, a: ArrayLike, b: ArrayLike, c: Optional[ArrayLike] = None, *,
                 alpha: Real = 1.0, beta: Optional[Real] = None, trans_a: Flag = False,
                 trans_b: Flag = False, device: str = "any",
                 out: Optional[OutArg] = None, **kw: Any) -> TaskFuture:
        inputs = [a, b] + ([c] if c is not None else [])
        # beta defaults as dspk-submit's --beta (cli.md): 1 when c is given, 0
        # without; a nonzero beta without c would silently add nothing, so it is
        # refused, where a zero one is taken as the protocol takes it (dspk-submit
        # refuses any --beta without C, zero too).  Nonzero as the daemon
        # decides it (protocol.md): the value the product computes with, so in an f32
        # product (f32, f16, bf16) one that rounds to 0 in f32 (1e-50) is 0, as alpha's
        # 0 that reads neither a nor b.
        f32 = _f32_op("gemm", a)
        if beta is None:
            beta_f: Union[int, float] = 1.0 if c is not None else 0.0
        else:
            beta_f = _scalar("beta", beta, f32)
            if c is None and not _zero_as_used(beta_f, f32):
                raise _errors.InvalidArgument("beta: %r without c (beta scales c; give c, "
                                              "or leave beta out)" % beta)
        opts = {"alpha": _scalar("alpha", alpha, f32), "beta": beta_f,
                "trans_a": _flag("trans_a", trans_a), "trans_b": _flag("trans_b", trans_b)}
        return self._run("gemm", inputs, opts, device, out, **kw)

    def _op_fft(self, x: ArrayLike, *, inverse: Flag = False, device: str = "any",
                out: Optional[OutArg] = None, **kw: Any) -> TaskFuture:
        return self._run("fft", [x], {"inverse": _flag("inverse", inverse)}, device, out, **kw)

    def _op_fir(self, x: ArrayLike, h: ArrayLike, *, device: str = "any",
                out: Optional[OutArg] = None, **kw: Any) -> TaskFuture:
        return self._run("fir", [x, h], {}, device, out, **kw)

    def _op_contract(self, subscripts: str, a: ArrayLike, b: ArrayLike, *,
                     device: str = "any", out: Optional[OutArg] = None,
                     **kw: Any) -> TaskFuture:
        return self._run("contract", [a, b], {"subscripts": _string("subscripts", subscripts)}, device, out,
                         **kw)

    def _op_reduce(self, x: ArrayLike, fn: str = "sum",
                   axes: Optional[Integers] = None, *, device: str = "any",
                   out: Optional[OutArg] = None, **kw: Any) -> TaskFuture:
        opts: Dict[str, Any] = {"fn": _string("fn", fn)}
        if axes is not None:
            opts["axes"] = _integers("axes", axes)
            if not opts["axes"]:
                raise _errors.InvalidArgument("axes: an empty sequence (None reduces over "
                                              "every axis)")
        return self._run("reduce", [x], opts, device, out, **kw)

    def _op_map(self, fn: str, a: ArrayLike, b: Optional[ArrayLike] = None, *,
                alpha: Real = 1.0, device: str = "any",
                out: Optional[OutArg] = None, **kw: Any) -> TaskFuture:
        inputs = [a] + ([b] if b is not None else [])
        return self._run("map", inputs, {"fn": _string("fn", fn),
                                       "alpha": _scalar("alpha", alpha, _f32_op("map", a))}, device,
                         out, **kw)

    def _op_kernel(self, source: KernelSource, *tensors: ArrayLike, lang: str,
                   grid: Integers, block: Optional[Integers] = None,
                   args: Optional[Iterable[Mapping[str, Any]]] = None, entry: str = "main",
                   shared: Integral = 0, device: str = "any", **kw: Any) -> TaskFuture:
        if not isinstance(source, (str, bytes, bytearray, memoryview)):
            raise _errors.InvalidArgument("source: expected a str or bytes, got %s"
                                          % _kind(source))
        if isinstance(source, memoryview):
            # not one of Python objects' addresses
            _byte_view("source", source, "pass the source as a str or bytes")
        if not 1 <= len(tensors) <= _KERNEL_TENSORS_MAX:
            # protocol.md's bound on a task's inputs, in the daemon's (and
            # libdspkclient's) words, before anything is sent or staged
            raise _errors.InvalidArgument(
                "inputs: expected a non-empty array of at most %d tensors, got an array "
                "of %d items" % (_KERNEL_TENSORS_MAX, len(tensors)))
        opts: Dict[str, Any] = {"lang": _string("lang", lang), "entry": _string("entry", entry),
                                "grid": _integers("grid", grid),
                                "shared": _int64("shared", shared),
                                "source": source if isinstance(source, str) else bytes(source)}
        if block is not None:
            opts["block"] = _integers("block", block)
        if args is not None:
            opts["args"] = _kernel_args(args)
        return self._run("kernel", list(tensors), opts, device, None, single=False, **kw)

    _OPS = ("gemm", "fft", "fir", "contract", "reduce", "map", "kernel")

    @overload
    def gemm(self, a: ArrayLike, b: ArrayLike, c: Optional[ArrayLike] = None, *,
             alpha: Real = ..., beta: Optional[Real] = ..., trans_a: Flag = ...,
             trans_b: Flag = ..., device: str = ..., out: None = None) -> np.ndarray: ...

    @overload
    def gemm(self, a: ArrayLike, b: ArrayLike, c: Optional[ArrayLike] = None, *,
             alpha: Real = ..., beta: Optional[Real] = ..., trans_a: Flag = ...,
             trans_b: Flag = ..., device: str = ..., out: _Out) -> _Out: ...

    @_public
    def gemm(self, a: ArrayLike, b: ArrayLike, c: Optional[ArrayLike] = None, *,
             alpha: Real = 1.0, beta: Optional[Real] = None, trans_a: Flag = False,
             trans_b: Flag = False, device: str = "any",
             out: Optional[OutArg] = None) -> Union[np.ndarray, OutArg]:
        """``alpha * op(a) @ op(b) + beta * c`` (op swaps the last two axes when trans_*);
        batch axes broadcast as in numpy.matmul.  f32 or f64 (the result of that
        dtype), or f16 or bf16 (the result f32).
        ``beta`` defaults to 1.0 when ``c`` is given (``gemm(a, b, c)`` is a@b + c, as
        dspk-submit's gemm) and to 0.0 without it; an explicit ``beta=0.0`` with ``c``
        reads no ``c`` (BLAS), and a nonzero ``beta`` without ``c`` is
        dspk.InvalidArgument: nonzero as the product computes with it, so for f32, f16
        and bf16 operands one that rounds to 0 in f32 (1e-50) is 0 and taken, as the
        daemon takes it.  Returns a numpy array, or ``out`` when given."""
        return self._wait(self._op_gemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a,
                                        trans_b=trans_b, device=device, out=out))

    @overload
    def fft(self, x: ArrayLike, *, inverse: Flag = ..., device: str = ...,
            out: None = None) -> np.ndarray: ...

    @overload
    def fft(self, x: ArrayLike, *, inverse: Flag = ..., device: str = ...,
            out: _Out) -> _Out: ...

    @_public
    def fft(self, x: ArrayLike, *, inverse: Flag = False, device: str = "any",
            out: Optional[OutArg] = None) -> Union[np.ndarray, OutArg]:
        """numpy.fft.fft (ifft when ``inverse``) of complex x along the last axis; real x
        gives numpy.fft.rfft."""
        return self._wait(self._op_fft(x, inverse=inverse, device=device, out=out))

    @overload
    def fir(self, x: ArrayLike, h: ArrayLike, *, device: str = ...,
            out: None = None) -> np.ndarray: ...

    @overload
    def fir(self, x: ArrayLike, h: ArrayLike, *, device: str = ...,
            out: _Out) -> _Out: ...

    @_public
    def fir(self, x: ArrayLike, h: ArrayLike, *, device: str = "any",
            out: Optional[OutArg] = None) -> Union[np.ndarray, OutArg]:
        """``scipy.signal.lfilter(h, 1, x)`` along the last axis (same shape as x)."""
        return self._wait(self._op_fir(x, h, device=device, out=out))

    @overload
    def contract(self, subscripts: str, a: ArrayLike, b: ArrayLike, *, device: str = ...,
                 out: None = None) -> np.ndarray: ...

    @overload
    def contract(self, subscripts: str, a: ArrayLike, b: ArrayLike, *, device: str = ...,
                 out: _Out) -> _Out: ...

    @_public
    def contract(self, subscripts: str, a: ArrayLike, b: ArrayLike, *, device: str = "any",
                 out: Optional[OutArg] = None) -> Union[np.ndarray, OutArg]:
        """``numpy.einsum(subscripts, a, b)``; subscripts need an explicit ``->``."""
        return self._wait(self._op_contract(subscripts, a, b, device=device, out=out))

    @overload
    def reduce(self, x: ArrayLike, fn: str = ...,
               axes: Optional[Integers] = ..., *, device: str = ...,
               out: None = None) -> np.ndarray: ...

    @overload
    def reduce(self, x: ArrayLike, fn: str = ...,
               axes: Optional[Integers] = ..., *, device: str = ...,
               out: _Out) -> _Out: ...

    @_public
    def reduce(self, x: ArrayLike, fn: str = "sum",
               axes: Optional[Integers] = None, *, device: str = "any",
               out: Optional[OutArg] = None) -> Union[np.ndarray, OutArg]:
        """``x.sum/max/min/mean(axis=axes)`` (``fn``; axes None: all, giving shape ())."""
        return self._wait(self._op_reduce(x, fn, axes, device=device, out=out))

    @overload
    def map(self, fn: str, a: ArrayLike, b: Optional[ArrayLike] = None, *,
            alpha: Real = ..., device: str = ..., out: None = None) -> np.ndarray: ...

    @overload
    def map(self, fn: str, a: ArrayLike, b: Optional[ArrayLike] = None, *,
            alpha: Real = ..., device: str = ..., out: _Out) -> _Out: ...

    @_public
    def map(self, fn: str, a: ArrayLike, b: Optional[ArrayLike] = None, *,
            alpha: Real = 1.0, device: str = "any",
            out: Optional[OutArg] = None) -> Union[np.ndarray, OutArg]:
        """Elementwise ``fn``: add, sub, mul (a, b), scale (alpha*a), axpy (alpha*a+b),
        abs, exp."""
        return self._wait(self._op_map(fn, a, b, alpha=alpha, device=device, out=out))

    @_public
    def kernel(self, source: KernelSource, *tensors: ArrayLike, lang: str,
               grid: Integers,
               block: Optional[Integers] = None,
               args: Optional[Iterable[Mapping[str, Any]]] = None, entry: str = "main",
               shared: Integral = 0, device: str = "any"
               ) -> List[Union[np.ndarray, DeviceArray]]:
        """Runs a raw kernel (``lang``: "cuda", "glsl", "spirv", "hip") on a GPU device,
        on 1 to 4 ``tensors`` (none, or more than 4, is dspk.InvalidArgument before
        anything is sent).  ``args`` are its parameters in order, each a one-key dict:
        ``{"tensor": i}``, ``{"i32": v}``, ``{"u32": v}``, ``{"i64": v}``, ``{"f32": v}``,
        ``{"f64": v}``.
        On vulkan the tensors are storage buffers 0, 1, ... of set 0 and the scalars
        fill the push-constant block: a shader using a binding or push-constant bytes
        that ``args`` do not give raises InvalidArgument.  A refused item of ``args`` is
        named ``options.args[i]``, as the daemon names it.
        Returns every tensor after the run (numpy arrays; DeviceArrays stay DeviceArrays)."""
        return self._wait(self._op_kernel(source, *tensors, lang=lang, grid=grid,
                                          block=block, args=args, entry=entry,
                                          shared=shared, device=device))

    @_public
    def submit(self, op: str, *args: Any, progress: Optional[Progress] = None,
               **kwargs: Any) -> TaskFuture:
        """Sends ``op`` (a name of the ops above: "gemm", "fft", ...) without waiting and
        returns a Future of its result; any number may be in flight on one connection.
        Nothing here waits, for an answer or for the socket: a step that needs an
        answer first goes to the client's worker thread, and the part of the request
        that the socket does not take at once (a daemon that reads slowly or not at
        all) is sent by a writer thread of its own, from a copy of the caller's
        operands; a failure of those steps (dspk.Timeout, dspk.Closed...) ends the
        future, never submit().  Errors of the arguments are raised here, as by the
        op's method.  ``progress(what, fraction)`` is called for the daemon's
        task.progress notifications (autotuning), before the future completes, on the
        client's ``dspk-callbacks`` thread (never on the thread reading the
        connection), as the future's done-callbacks are."""
        if op not in self._OPS:
            raise _errors.InvalidArgument("submit: unknown op %r (one of %s)"
                                          % (op, ", ".join(self._OPS)))
        if progress is not None and not callable(progress):
            raise _errors.InvalidArgument("progress: expected a callable, got %s"
                                          % _kind(progress))
        try:  # a bad call names the public method, not the private one behind it
            inspect.signature(getattr(self, op)).bind(*args, **kwargs)
        except TypeError as e:
            if from_signal_handler(e):
                raise  # a signal handler's: the caller's, as it is
            raise TypeError("submit(%r, ...): %s" % (op, e)) from None
        # First on this thread: the arguments are checked (their errors raised here)
        # and the task is sent at once, unless a step would wait for an answer (a
        # staged operand's or a large result's temporary buffer, which the daemon
        # answers behind the device's earlier tasks) or earlier submit()s are still
        # with the worker: then the worker thread does it all, in order, and every
        # failure of it goes to the future.
        tl = self._tl
        was = getattr(tl, "deferring", False)
        try:
            tl.deferring = True  # inside the try: an interruption cannot leave it set
            return getattr(self, "_op_" + op)(*args, progress=progress, is_async=True,
                                              **kwargs)
        except _Defer:
            pass
        finally:
            tl.deferring = was
        return self._defer(op, args, kwargs, progress)
