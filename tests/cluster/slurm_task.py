#!/usr/bin/env python3
"""What a job of tests/cluster/slurm_test.py runs, inside Slurm (a batch script of the test
calls it with the venv's python, where the dspk package is pip-installed).  Each mode writes
one JSON result to $DSPK_TEST_OUT/<mode>-<job id>.json; any failed check raises (the job
fails, and the test with it).

  array   a task of the job array, allocated one GPU (lavapipe): the daemon of its node
          (the socket the TaskProlog chose), devices = cpu + that GPU, a gemm with
          dspk-submit and a gemm, fft and map with the Python client, all against numpy
  nogpu   a job without GPUs: devices = cpu only; the GPU is ENODEV (dspk-submit, buffers
          and tasks of the Python client), a claim of another job is EPERM
  holder  leaves a connection with a buffer and a task behind (a process that escapes the
          job with setsid), so that only the epilog can clean it up; records what the
          daemon holds of the job before the job ends

Environment: DSPK_TEST_OUT, DSPK_TEST_SUBMIT (dspk-submit), DSPK_TEST_GPU (the UUID the
allocation maps to), DSPK_TEST_WORK; Slurm's SLURM_JOB_ID, SLURMD_NODENAME; DSPK_SOCKET
from the TaskProlog.
"""
import json
import os
import subprocess
import sys

import numpy as np

import dspk


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def submit(*args, ok=True):
    p = subprocess.run([os.environ["DSPK_TEST_SUBMIT"]] + list(args), capture_output=True,
                       text=True, timeout=120)
    if ok:
        check(p.returncode == 0, "dspk-submit %s: %d: %s" % (" ".join(args), p.returncode,
                                                            p.stderr))
    return p


def norm(u):
    return "".join(ch for ch in u.lower() if ch in "0123456789abcdef")


def main():
    mode = sys.argv[1]
    node = os.environ["SLURMD_NODENAME"]
    job = int(os.environ["SLURM_JOB_ID"])
    work = os.environ["DSPK_TEST_WORK"]
    out = os.environ["DSPK_TEST_OUT"]
    sock = os.environ.get("DSPK_SOCKET", "")
    check(sock == os.path.join(work, "dspkd-%s.sock" % node),
          "the TaskProlog's DSPK_SOCKET %r is node %s's" % (sock, node))
    gpu_uuid = norm(os.environ["DSPK_TEST_GPU"])
    res = {"mode": mode, "node": node, "job": job, "socket": sock}
    tid = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    rng = np.random.default_rng(1000 + tid)
    tmp = os.path.join(work, "tmp-%d" % job)
    os.makedirs(tmp, exist_ok=True)

    devs = json.loads(submit("devices", "--json").stdout)["devices"]
    res["devices"] = [d["id"] for d in devs]
    cpu = [d["id"] for d in devs if d["backend"] == "cpu"]
    gpus = [d["id"] for d in devs if d["backend"] != "cpu"]
    check(len(cpu) == 1, "one cpu device: %r" % devs)

    if mode in ("array", "holder"):
        check(len(gpus) == 1 and norm([d for d in devs if d["id"] == gpus[0]][0]["uuid"])
              == gpu_uuid, "the allocated GPU only: %r" % devs)
        gpu = gpus[0]
    if mode == "array":
        # dspk-submit: a gemm on the job's GPU, checked against numpy.
        a = rng.standard_normal((24, 16)).astype(np.float32)
        b = rng.standard_normal((16, 8)).astype(np.float32)
        np.save(os.path.join(tmp, "a.npy"), a)
        np.save(os.path.join(tmp, "b.npy"), b)
        submit("gemm", "--device", gpu, os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy"),
               "-o", os.path.join(tmp, "c.npy"))
        c = np.load(os.path.join(tmp, "c.npy"))
        check(np.allclose(c, a @ b, rtol=1e-4, atol=1e-4), "dspk-submit gemm")
        # The Python client (default socket: $DSPK_SOCKET; job: $SLURM_JOB_ID).
        with dspk.Client() as cl:
            st = cl.status()
            me = [x for x in st["clients"] if x.get("self")]
            x = rng.standard_normal((12, 12))
            check(np.allclose(cl.gemm(x, x, device="any"), x @ x), "python gemm on any")
            y = cl.gemm(a, b, device=gpu)
            check(np.allclose(y, a @ b, rtol=1e-4, atol=1e-4), "python gemm on " + gpu)
            z = (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(np.complex128)
            check(np.allclose(cl.fft(z, device=cpu[0]), np.fft.fft(z)), "python fft")
            w = cl.map("add", a, a, device=gpu)
            check(np.allclose(w, a + a), "python map add on " + gpu)
            # status after the first device request shows the connection's job.
            me = [x for x in cl.status()["clients"] if x.get("self")]
            check(me and me[0].get("job") == job, "status: this client's job %r" % me)
        res["ok"] = True
    elif mode == "nogpu":
        check(not gpus, "no GPU for a job without one: %r" % devs)
        gpu = os.environ["DSPK_TEST_GPU_ID"]
        np.save(os.path.join(tmp, "a.npy"), np.ones((4, 4), np.float32))
        p = submit("gemm", "--device", gpu, os.path.join(tmp, "a.npy"),
                   os.path.join(tmp, "a.npy"), ok=False)
        check(p.returncode == 1 and "ENODEV" in p.stderr, "dspk-submit on %s: %d %s" %
              (gpu, p.returncode, p.stderr))
        res["submit_error"] = p.stderr.strip()
        with dspk.Client() as cl:
            try:
                cl.to_device(np.ones(4, np.float32), device=gpu)
                raise AssertionError("a buffer on the excluded device")
            except dspk.NoDevice as e:
                res["buffer_error"] = str(e)
            try:
                cl.gemm(np.ones((2, 2)), np.ones((2, 2)), device=gpu)
                raise AssertionError("a task on the excluded device")
            except dspk.NoDevice:
                pass
            one = np.arange(6.0).reshape(2, 3)
            check(np.allclose(cl.gemm(one, one.T), one @ one.T), "the cpu still works")
        # Claiming another job (one not registered here for this uid) is EPERM.
        env = dict(os.environ, DSPK_JOB="4000000000")
        p = subprocess.run([os.environ["DSPK_TEST_SUBMIT"], "devices"], env=env,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 1 and "EPERM" in p.stderr, "claim of another job: %s" % p.stderr)
        res["ok"] = True
    elif mode == "holder":
        # A process that outlives the job: it keeps a connection of the job with a buffer
        # and waits until the daemon closes it (the epilog), then tells the test through
        # the FIFO the test holds open (closing it).
        ready_r, ready_w = os.pipe()
        subprocess.Popen(["setsid", "-f", sys.executable, os.path.abspath(__file__),
                          "hold", str(ready_w), gpu], pass_fds=[ready_w])
        os.close(ready_w)
        line = os.read(ready_r, 64)
        os.close(ready_r)
        check(line.startswith(b"ready"), "the holder is ready: %r" % line)
        # root is an admin: the job as the daemon sees it now.
        st = json.loads(submit("status", "--json").stdout)
        res["before_end"] = [j for j in st.get("jobs", []) if j["job"] == job]
        res["ok"] = True
    path = os.path.join(out, "%s-%d.json" % (mode, job))
    with open(path + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(path + ".tmp", path)
    return 0


def hold():
    """The escaped process: a raw connection (tests/common/dspk_rpc.py) that names the job
    in hello like the clients do, a buffer on the GPU, then blocks until the daemon closes
    the connection."""
    ready_w, gpu = int(sys.argv[2]), sys.argv[3]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "common"))
    from dspk_rpc import Client
    fifo = os.path.join(os.environ["DSPK_TEST_WORK"], "holder.fifo")
    with open(os.path.join(os.environ["DSPK_TEST_WORK"], "holder.pid"), "w") as f:
        f.write(str(os.getpid()))  # for the test to stop it if it fails
    done = os.open(fifo, os.O_WRONLY)  # the test reads it: EOF once this process is gone
    c = Client(os.environ["DSPK_SOCKET"], 600)
    c.call("hello", {"version": 1, "client": "holder", "job": int(os.environ["SLURM_JOB_ID"])})
    c.call("buffer.create", {"device": gpu, "size": 1 << 20})
    os.write(ready_w, b"ready\n")
    os.close(ready_w)
    c.expect_eof()
    os.write(done, b"closed\n")
    os.close(done)
    return 0


if __name__ == "__main__":
    sys.exit(hold() if sys.argv[1] == "hold" else main())
