"""dspk: the Python client of dspkd, the dspk compute daemon.

numpy arrays in, numpy arrays out::

    import numpy as np, dspk
    with dspk.connect() as c:                  # $DSPK_SOCKET or the default socket
        a = np.random.rand(1024, 1024).astype(np.float32)
        b = c.gemm(a, a)                       # == a @ a, computed by the daemon
        y = c.fft(np.ones(4096, np.complex64)) # == numpy.fft.fft

See docs/python.md of the dspk repository for the whole interface.
"""
from ._client import Client, DeviceArray, TaskFuture, connect, default_socket
from ._dtypes import DTYPES, bfloat16, from_bfloat16, to_bfloat16
# Error and one subclass per code, named one by one so that type checkers see them
# (the stub _errors.pyi declares them; test_client checks this list against it).
from ._errors import (Busy, Canceled, Closed, CompileError, ConnectError, DeviceError,
                      DtypeError, Error, InternalError, InvalidArgument, IOFailure,
                      LimitExceeded, NoBuffer, NoDevice, NoMethod, NotFound, NotSupported,
                      OutOfMemory, PermissionDenied, ProtocolError, RangeError, ShapeError,
                      Shutdown, Timeout, VersionMismatch, error_from)

__version__ = "0.1.0"

# Exactly the names of python.md's "Names" (test_client checks the two agree).
__all__ = ["connect", "default_socket", "Client", "DeviceArray", "TaskFuture", "DTYPES",
           "bfloat16", "to_bfloat16", "from_bfloat16", "__version__",
           "Error", "InvalidArgument", "OutOfMemory", "ProtocolError", "LimitExceeded",
           "NoMethod", "NoDevice", "DtypeError", "ShapeError", "NoBuffer", "RangeError",
           "Canceled", "Shutdown", "PermissionDenied", "IOFailure", "Closed", "ConnectError",
           "DeviceError", "CompileError", "NotSupported", "Busy", "Timeout", "NotFound",
           "VersionMismatch", "InternalError", "error_from"]
