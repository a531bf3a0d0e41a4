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
from ._errors import *  # noqa: F401,F403 - Error and one subclass per code
from ._errors import __all__ as _error_names

__version__ = "0.1.0"

float32 = DTYPES["f32"]
float64 = DTYPES["f64"]
complex64 = DTYPES["c64"]
complex128 = DTYPES["c128"]
float16 = DTYPES["f16"]

__all__ = ["connect", "default_socket", "Client", "DeviceArray", "TaskFuture", "DTYPES",
           "bfloat16", "to_bfloat16", "from_bfloat16", "float32", "float64", "complex64",
           "complex128", "float16", "__version__"] + list(_error_names)
