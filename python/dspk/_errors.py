"""dspk.Error and one subclass per error code of docs/protocol.md."""
from __future__ import annotations

import signal
import types
from typing import Any, Dict, Mapping, Tuple, Type

__all__ = [
    "Error", "InvalidArgument", "OutOfMemory", "ProtocolError", "LimitExceeded",
    "NoMethod", "NoDevice", "DtypeError", "ShapeError", "NoBuffer", "RangeError",
    "Canceled", "Shutdown", "PermissionDenied", "IOFailure", "Closed", "ConnectError",
    "DeviceError", "CompileError", "NotSupported", "Busy", "Timeout", "NotFound",
    "VersionMismatch", "InternalError", "error_from",
]


class Error(Exception):
    """An error of the daemon or of this client.

    ``Error(message)`` built directly, with no ``code``, has the code -24 and name
    EINTERNAL of an internal error, yet stays of class Error (not InternalError);
    pickle and copy keep its class, args, code, name, message and attributes.

    Attributes:
        code: the stable negative code of docs/protocol.md (e.g. -8).
        name: its symbolic name (e.g. ``"ESHAPE"``).
        message: the one-line detail (which operand, which axis, ...).
    """

    code: int = -24
    name: str = "EINTERNAL"

    def __init__(self, message: str = "", *, code: int | None = None,
                 name: str | None = None) -> None:
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name
        self.message = message
        super().__init__("%s: %s" % (self.name, message) if message else self.name)

    def __reduce__(self) -> Any:
        # As a builtin exception pickles and copies: its class, its args, and its
        # __dict__ (message, a code and name of its own, the notes of add_note(), what
        # a caller set); __cause__, __context__ and __traceback__ are not kept, as
        # there (probe 22 C2: the notes and attributes were dropped, and an Error built
        # directly came back as InternalError).
        return (_restore, (type(self), self.args, self.code, self.name, self.message),
                self.__dict__ or None)


def _restore(cls: Type[Error], args: Tuple[Any, ...], code: int, name: str,
             message: str) -> Error:
    """An exception of class ``cls`` (dspk.Error or a subclass) as pickled by
    Error.__reduce__: made as the class makes it (a code and name passed only where
    they are not the class's), ``args`` then as they were; its state, the __dict__
    pickled with it, is set next."""
    if not (isinstance(cls, type) and issubclass(cls, Error)):
        raise TypeError("not a dspk.Error class: %r" % (cls,))
    kw: Dict[str, Any] = {}
    if code != cls.code:
        kw["code"] = code
    if name != cls.name:
        kw["name"] = name
    e = cls(message, **kw)
    e.args = tuple(args)
    return e


def _rebuild(code: int, name: str, message: str) -> Error:
    """What pickles made by an earlier client call (class by code, as error_from)."""
    return error_from({"code": code, "name": name, "message": message})


# One row per error code of docs/protocol.md: the class, the builtin exception
# it also derives from (or None), the code, its name and the docstring's text.
_TABLE = (
    ("InvalidArgument", ValueError, -1, "EINVAL", "invalid argument."),
    ("OutOfMemory", MemoryError, -2, "ENOMEM", "out of memory."),
    ("ProtocolError", None, -3, "EPROTO", "protocol error."),
    ("LimitExceeded", None, -4, "ELIMIT", "a limit of the daemon was exceeded."),
    ("NoMethod", None, -5, "ENOMETHOD", "unknown method."),
    ("NoDevice", None, -6, "ENODEV", "no such device."),
    ("DtypeError", TypeError, -7, "EDTYPE", "unsupported dtype."),
    ("ShapeError", ValueError, -8, "ESHAPE", "shape mismatch."),
    ("NoBuffer", None, -9, "ENOBUF", "no such buffer (freed, or of another connection)."),
    ("RangeError", IndexError, -10, "ERANGE", "out of range."),
    ("Canceled", None, -11, "ECANCELED", "task canceled."),
    ("Shutdown", None, -12, "ESHUTDOWN", "the daemon is shutting down."),
    ("PermissionDenied", PermissionError, -13, "EPERM", "permission denied."),
    ("IOFailure", None, -14, "EIO", "i/o error."),
    ("Closed", ConnectionError, -15, "ECLOSED",
     "the connection is closed (by close(), or the daemon went away)."),
    ("ConnectError", ConnectionError, -16, "ECONNECT", "cannot connect to the daemon."),
    ("DeviceError", None, -17, "EDEVICE", "device error."),
    ("CompileError", None, -18, "ECOMPILE",
     "kernel compilation failed (the message holds the compiler log)."),
    ("NotSupported", NotImplementedError, -19, "ENOTSUP",
     "operation not supported (by this device, or by this daemon)."),
    ("Busy", None, -20, "EBUSY", "resource busy."),
    ("Timeout", TimeoutError, -21, "ETIMEDOUT", "timed out waiting for the daemon."),
    ("NotFound", None, -22, "ENOENT", "not found."),
    ("VersionMismatch", None, -23, "EVERSION", "protocol version mismatch."),
    ("InternalError", None, -24, "EINTERNAL", "internal error."),
)


def _subclass(cls_name: str, builtin: Type[BaseException] | None, code: int, name: str,
              text: str) -> Type[Error]:
    bases = (Error,) if builtin is None else (Error, builtin)
    return type(cls_name, bases, {
        "__doc__": "%s (%d): %s" % (name, code, text), "__module__": __name__,
        "__qualname__": cls_name, "code": code, "name": name})


_BY_CODE: Dict[int, Type[Error]] = {}
_BY_NAME: Dict[str, Type[Error]] = {}
for _row in _TABLE:
    _BY_CODE[_row[2]] = _BY_NAME[_row[3]] = globals()[_row[0]] = _subclass(*_row)
del _row


def _wire_text(v: Any) -> str:
    """Text of an answer as the client shows it: a msgpack str as it is (the decoder
    put U+FFFD in place of what is not UTF-8), a bin (``bytes``) decoded the same way,
    ``bytes.decode(errors="replace")``; nothing (``None``) is ""; any other value as
    ``str()`` gives it."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _handler_codes() -> set:
    """The code objects of the Python signal handlers installed now."""
    codes = set()
    for s in signal.valid_signals():
        try:
            h = signal.getsignal(s)
        except (ValueError, OSError):
            continue
        if h is None or isinstance(h, int):  # SIG_DFL, SIG_IGN, not set from Python
            continue
        for _ in range(4):  # a bound method, a functools.partial, an object's __call__
            code = getattr(h, "__code__", None)
            if isinstance(code, types.CodeType):
                codes.add(code)
                break
            nxt = getattr(h, "__func__", None) or getattr(h, "func", None)
            if nxt is None and not isinstance(h, (type, types.BuiltinFunctionType)):
                nxt = getattr(type(h), "__call__", None)
            h = nxt
            if h is None:
                break
    return codes


def _from_signal_handler(e: BaseException) -> bool:
    """Whether ``e`` was raised by a Python signal handler (a frame of one installed
    now is in its traceback): the caller's exception, which propagates as it is, not
    a failure of the code that was running."""
    tb = e.__traceback__
    if tb is None or tb.tb_next is None:
        # Raised in the frame that caught it (a C call's own, a raise statement): a
        # handler's has the handler's frame after that one.  (Cheap: checked first.)
        return False
    codes = _handler_codes()
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _describe(e: BaseException) -> str:
    """An exception as a message of the client's names it: ``"FormatError: text"``, or
    ``"FormatError (with no message)"`` where its text is empty (never a bare
    ``"FormatError: "``)."""
    try:
        text = str(e)
    except Exception as x:  # noqa: BLE001 - an object's __str__ that raises: said so
        if _from_signal_handler(x):
            raise  # a signal handler's: the caller's, as it is
        text = "(its str() failed)"
    return "%s: %s" % (type(e).__name__, text) if text else \
        "%s (with no message)" % type(e).__name__


def error_from(err: Mapping[str, Any]) -> Error:
    """The exception for an error map ``{code, name, message}`` of the protocol: the
    class of its integer ``code`` (whose own name it has, whatever ``name`` says); with
    no integer code, the class its ``name`` says, else InternalError; a code outside the
    table is a plain Error keeping that code and its ``name`` (``"EUNKNOWN"``, as
    libdspkclient's dspk_err_name() says, where it sent none or one of another code).
    Text sent as msgpack bin, or not valid UTF-8, decodes with U+FFFD in place of what
    is bad.  ``err`` that is not a mapping (a str, None: no error map of the protocol)
    gives ProtocolError saying so, as the client raises for such an answer."""
    if not isinstance(err, Mapping):
        text = repr(err)
        return _BY_CODE[-3]("an error that is not a map: %s %s" % (
            type(err).__name__, text if len(text) <= 40 else text[:37] + "..."))
    code = err.get("code")
    name = _wire_text(err.get("name"))
    message = _wire_text(err.get("message"))
    if isinstance(code, bool) or not isinstance(code, int):
        # No code (or not an integer): the class its name says, else EINTERNAL.
        return _BY_NAME.get(name, _BY_CODE[-24])(message)
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message)  # its name is its code's: the name sent cannot contradict it
    if not name or name in _BY_NAME:  # none, or the name of another code
        name = "EUNKNOWN"
    return Error(message, code=code, name=name)
