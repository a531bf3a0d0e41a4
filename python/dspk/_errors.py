"""dspk.Error and one subclass per error code of docs/protocol.md."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Type

__all__ = [
    "Error", "InvalidArgument", "OutOfMemory", "ProtocolError", "LimitExceeded",
    "NoMethod", "NoDevice", "DtypeError", "ShapeError", "NoBuffer", "RangeError",
    "Canceled", "Shutdown", "PermissionDenied", "IOFailure", "Closed", "ConnectError",
    "DeviceError", "CompileError", "NotSupported", "Busy", "Timeout", "NotFound",
    "VersionMismatch", "InternalError", "error_from",
]


class Error(Exception):
    """An error of the daemon or of this client.

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
        return (_rebuild, (self.code, self.name, self.message))


def _rebuild(code: int, name: str, message: str) -> Error:
    return error_from({"code": code, "name": name, "message": message})


class InvalidArgument(Error, ValueError):
    """EINVAL (-1): invalid argument."""
    code, name = -1, "EINVAL"


class OutOfMemory(Error, MemoryError):
    """ENOMEM (-2): out of memory."""
    code, name = -2, "ENOMEM"


class ProtocolError(Error):
    """EPROTO (-3): protocol error."""
    code, name = -3, "EPROTO"


class LimitExceeded(Error):
    """ELIMIT (-4): a limit of the daemon was exceeded."""
    code, name = -4, "ELIMIT"


class NoMethod(Error):
    """ENOMETHOD (-5): unknown method."""
    code, name = -5, "ENOMETHOD"


class NoDevice(Error):
    """ENODEV (-6): no such device."""
    code, name = -6, "ENODEV"


class DtypeError(Error, TypeError):
    """EDTYPE (-7): unsupported dtype."""
    code, name = -7, "EDTYPE"


class ShapeError(Error, ValueError):
    """ESHAPE (-8): shape mismatch."""
    code, name = -8, "ESHAPE"


class NoBuffer(Error):
    """ENOBUF (-9): no such buffer (freed, or of another connection)."""
    code, name = -9, "ENOBUF"


class RangeError(Error, IndexError):
    """ERANGE (-10): out of range."""
    code, name = -10, "ERANGE"


class Canceled(Error):
    """ECANCELED (-11): task canceled."""
    code, name = -11, "ECANCELED"


class Shutdown(Error):
    """ESHUTDOWN (-12): the daemon is shutting down."""
    code, name = -12, "ESHUTDOWN"


class PermissionDenied(Error, PermissionError):
    """EPERM (-13): permission denied."""
    code, name = -13, "EPERM"


class IOFailure(Error):
    """EIO (-14): i/o error."""
    code, name = -14, "EIO"


class Closed(Error, ConnectionError):
    """ECLOSED (-15): the connection is closed (by close(), or the daemon went away)."""
    code, name = -15, "ECLOSED"


class ConnectError(Error, ConnectionError):
    """ECONNECT (-16): cannot connect to the daemon."""
    code, name = -16, "ECONNECT"


class DeviceError(Error):
    """EDEVICE (-17): device error."""
    code, name = -17, "EDEVICE"


class CompileError(Error):
    """ECOMPILE (-18): kernel compilation failed (the message holds the compiler log)."""
    code, name = -18, "ECOMPILE"


class NotSupported(Error, NotImplementedError):
    """ENOTSUP (-19): operation not supported (by this device, or by this daemon)."""
    code, name = -19, "ENOTSUP"


class Busy(Error):
    """EBUSY (-20): resource busy."""
    code, name = -20, "EBUSY"


class Timeout(Error, TimeoutError):
    """ETIMEDOUT (-21): timed out waiting for the daemon."""
    code, name = -21, "ETIMEDOUT"


class NotFound(Error):
    """ENOENT (-22): not found."""
    code, name = -22, "ENOENT"


class VersionMismatch(Error):
    """EVERSION (-23): protocol version mismatch."""
    code, name = -23, "EVERSION"


class InternalError(Error):
    """EINTERNAL (-24): internal error."""
    code, name = -24, "EINTERNAL"


_BY_CODE: Dict[int, Type[Error]] = {
    cls.code: cls for cls in (
        InvalidArgument, OutOfMemory, ProtocolError, LimitExceeded, NoMethod, NoDevice,
        DtypeError, ShapeError, NoBuffer, RangeError, Canceled, Shutdown, PermissionDenied,
        IOFailure, Closed, ConnectError, DeviceError, CompileError, NotSupported, Busy,
        Timeout, NotFound, VersionMismatch, InternalError)
}


def error_from(err: Mapping[str, Any]) -> Error:
    """The exception for an error map ``{code, name, message}`` of the protocol."""
    code = err.get("code")
    name = err.get("name")
    message = err.get("message") or ""
    if not isinstance(code, int):
        code = -24
    cls = _BY_CODE.get(code, Error)
    if not isinstance(name, str) or not name:
        name = cls.name if cls is not Error else "E%d" % -code
    return cls(str(message), code=code, name=name)
