#!/usr/bin/env python3
"""Shared-memory buffers on the GPU backends (scripts/gpu-all.sh step shm_gpu).

Starts dspkd with every backend and, on each cuda and vulkan device, checks against numpy
that shared arrays (Client.empty_shared: buffer.import of a sealed memfd) work as operands
and as out=: cuda keeps a device block and copies around each task, through a mapping
pinned with cuMemHostRegister; a discrete Vulkan GPU does the same through a mapping
imported with VK_EXT_external_memory_host (where offered; else staged copies), and a
Vulkan device whose memory is host memory (lavapipe) uses the pages in place.  Then times a reduce of 64 MiB read from a shared
array against the same reduce of a device-resident buffer: the difference is the copy of
client memory to the device, printed as GB/s.  Exit status 0 when every check passed, 77 without a cuda or vulkan device (ctest
daemon_shm_gpu: lavapipe in CI).

    shm_gpu.py --dspkd build/daemon/dspkd
"""
import argparse
import os
import select
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python"))
import dspk  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dspk-shmgpu-")
    sock = os.path.join(d, "d.sock")
    r, w = os.pipe()
    proc = subprocess.Popen([args.dspkd, "--foreground", "--socket", sock, "--no-cache",
                             "--ready-fd", str(w)], pass_fds=[w])
    os.close(w)
    ready, _, _ = select.select([r], [], [], 120)
    if not ready or os.read(r, 16) != b"READY\n":
        print("dspkd did not start")
        proc.kill()
        return 1
    bad = 0
    try:
        with dspk.connect(sock, timeout=300) as c:
            devs = [x["id"] for x in c.devices() if x["backend"] in ("cuda", "vulkan")]
            print("devices:", devs)
            if not devs:
                print("no cuda or vulkan device: skipped")
                bad = -1
            rng = np.random.default_rng(5)
            for dev in devs:
                try:
                    a = c.empty_shared((512, 384), np.float32, device=dev)
                    b = c.empty_shared((384, 256), np.float32, device=dev)
                    o = c.empty_shared((512, 256), np.float32, device=dev)
                    a[:] = rng.standard_normal(a.shape)
                    b[:] = rng.standard_normal(b.shape)
                    res = c.gemm(a, b, out=o)
                    assert res is o
                    np.testing.assert_allclose(o, a @ b, rtol=1e-3, atol=1e-3)
                    s = c.map("scale", a, alpha=3.0)
                    np.testing.assert_allclose(s, 3 * a, rtol=1e-6)
                    x = c.empty_shared(1 << 16, np.complex64, device=dev)
                    x[:] = rng.standard_normal(x.size) + 1j * rng.standard_normal(x.size)
                    np.testing.assert_allclose(c.fft(x), np.fft.fft(x), rtol=1e-3, atol=1e-2)
                    a[:] = 1.0  # written between tasks: the next task sees it
                    np.testing.assert_allclose(c.gemm(a, b), np.ones_like(a) @ b, rtol=1e-3,
                                               atol=1e-3)
                    print("OK", dev, "shared operands and out=")
                    n = 1 << 24  # 64 MiB: within maxStorageBufferRange (vulkan)
                    big = c.empty_shared(n, np.float32, device=dev)
                    big[:] = 1.0
                    resident = c.to_device(big, dev)
                    t_sh, t_dev = [], []
                    # the runner's time_us of each (the raw answer has it)
                    for ref, out in ((big, t_sh), (resident, t_dev)):
                        for _ in range(5):
                            t = {"dtype": "f32", "shape": [n]}
                            if isinstance(ref, np.ndarray):
                                buf, off, _ = c._shared_ref(ref)
                            else:
                                buf, off = ref.buffer, ref.offset
                            t.update(buffer=buf, offset=off)
                            res = c._call("task.run", {"op": "reduce", "device": dev,
                                                       "inputs": [t]})
                            out.append(res["time_us"])
                    ms, md = float(np.median(t_sh)), float(np.median(t_dev))
                    copy = ("client memory to device about %.1f GB/s"
                            % (4 * n / (ms - md) / 1e3)) if ms > md else \
                        "no copy to measure (used in place)"
                    print("%s reduce 64 MiB (median of 5 time_us): shared %.0f us, "
                          "resident %.0f us -> %s" % (dev, ms, md, copy))
                    resident.free()
                except Exception as e:  # noqa: BLE001 - report every device
                    bad += 1
                    print("FAIL", dev, type(e).__name__, e)
    finally:
        proc.terminate()
        rc = proc.wait(60)
        print("dspkd exit status", rc)
    if bad < 0 and rc == 0:
        return 77
    return 1 if bad or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
