"""A small msgpack-RPC client of dspkd written from docs/protocol.md, shared
by the Python end-to-end scripts (tests/lifecycle, tests/daemon/gpu_smoke.py).
Needs only python3 and msgpack.  tests/daemon/dspkd_test.py derives a stricter
client from it that checks the protocol's framing rules as it reads."""
import socket

import msgpack


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class RpcError(Exception):
    def __init__(self, err):
        super().__init__("%s: %s" % (err.get("name"), err.get("message")))
        self.name = err.get("name")
        self.code = err.get("code")
        self.err = err


class Client:
    def __init__(self, path, timeout):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.up = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
        self.msgid = 0
        self.responses = {}
        self.notes = []  # the daemon's notifications, [2, method, params]

    def send(self, method, args=None, fds=None):
        """fds: file descriptors sent with the request's first byte
        (buffer.import)."""
        self.msgid += 1
        params = [args] if args is not None else []
        frame = msgpack.packb([0, self.msgid, method, params], use_bin_type=True)
        if fds:
            n = socket.send_fds(self.sock, [frame[:1]], fds)
            frame = frame[n:]
        self.sock.sendall(frame)
        return self.msgid

    def pump(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("connection closed by the daemon")
        self.up.feed(data)
        for m in self.up:
            if m[0] == 1:
                self.responses[m[1]] = m
            elif m[0] == 2:
                self.notes.append(m)

    def wait(self, msgid):
        while msgid not in self.responses:
            self.pump()
        m = self.responses.pop(msgid)
        if m[2] is not None:
            raise RpcError(m[2])
        return m[3]

    def outcome(self, msgid):
        """'ok' or the error's name."""
        try:
            self.wait(msgid)
            return "ok"
        except RpcError as e:
            return e.name

    def call(self, method, args=None, fds=None):
        return self.wait(self.send(method, args, fds))

    def expect_eof(self):
        try:
            while True:
                self.pump()
        except (EOFError, ConnectionResetError):
            pass

    def close(self):
        self.sock.close()
