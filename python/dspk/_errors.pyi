"""Type stubs of dspk._errors: its error classes are made at import from one
table (_errors.py), which static checkers cannot see.  ``__all__`` is spelled out
(the same list as _errors.py's, which test_client checks): a checker takes the
names of ``from ._errors import *`` from it, and a bare annotation would give none."""
from typing import Any, Mapping

__all__ = [
    "Error", "InvalidArgument", "OutOfMemory", "ProtocolError", "LimitExceeded",
    "NoMethod", "NoDevice", "DtypeError", "ShapeError", "NoBuffer", "RangeError",
    "Canceled", "Shutdown", "PermissionDenied", "IOFailure", "Closed", "ConnectError",
    "DeviceError", "CompileError", "NotSupported", "Busy", "Timeout", "NotFound",
    "VersionMismatch", "InternalError", "error_from",
]

class Error(Exception):
    code: int
    name: str
    message: str
    def __init__(self, message: str = ..., *, code: int | None = ...,
                 name: str | None = ...) -> None: ...

class InvalidArgument(Error, ValueError): ...  # EINVAL -1
class OutOfMemory(Error, MemoryError): ...  # ENOMEM -2
class ProtocolError(Error): ...  # EPROTO -3
class LimitExceeded(Error): ...  # ELIMIT -4
class NoMethod(Error): ...  # ENOMETHOD -5
class NoDevice(Error): ...  # ENODEV -6
class DtypeError(Error, TypeError): ...  # EDTYPE -7
class ShapeError(Error, ValueError): ...  # ESHAPE -8
class NoBuffer(Error): ...  # ENOBUF -9
class RangeError(Error, IndexError): ...  # ERANGE -10
class Canceled(Error): ...  # ECANCELED -11
class Shutdown(Error): ...  # ESHUTDOWN -12
class PermissionDenied(Error, PermissionError): ...  # EPERM -13
class IOFailure(Error): ...  # EIO -14
class Closed(Error, ConnectionError): ...  # ECLOSED -15
class ConnectError(Error, ConnectionError): ...  # ECONNECT -16
class DeviceError(Error): ...  # EDEVICE -17
class CompileError(Error): ...  # ECOMPILE -18
class NotSupported(Error, NotImplementedError): ...  # ENOTSUP -19
class Busy(Error): ...  # EBUSY -20
class Timeout(Error, TimeoutError): ...  # ETIMEDOUT -21
class NotFound(Error): ...  # ENOENT -22
class VersionMismatch(Error): ...  # EVERSION -23
class InternalError(Error): ...  # EINTERNAL -24

def error_from(err: Mapping[str, Any]) -> Error: ...

# The client's own helpers (not exported by the package).
def _wire_text(v: Any) -> str: ...
def _describe(e: BaseException) -> str: ...
def _from_signal_handler(e: BaseException) -> bool: ...
