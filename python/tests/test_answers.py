"""Answers of the daemon that are not what protocol.md says (a fake daemon sends them):
every one the client parses fails its call with dspk.ProtocolError, and a message
that is no protocol message at all closes the connection (dspk.Closed), never a bare
KeyError/TypeError/... nor a call that waits for ever."""
from __future__ import annotations

import socket
import threading
import time

import msgpack
import numpy as np
import pytest

import dspk
from conftest import LIMITS, TIMEOUT

HELLO = {"protocol": 1, "daemon": "fake", "server": "dspkd", "client_id": 7,
         "limits": LIMITS}
DEVICE = {"id": "cpu:0", "backend": "cpu", "name": "cpu", "type": "cpu", "arch": "x",
          "driver": "", "uuid": "", "memory": 1 << 30, "software": False,
          "ops": {"map": ["f32"]}, "kernel_langs": []}


class Fake:
    """A daemon on ``path`` that answers each request with ``answers[method](msgid)``
    (raw bytes), hello with a well-formed answer unless ``answers`` says otherwise;
    records every request."""

    def __init__(self, path, answers):
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)
        self.path = path
        self.answers = answers
        self.requests = []
        self.conn = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.conn, _ = self.srv.accept()
        up = msgpack.Unpacker(raw=False)
        while True:
            try:
                data = self.conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            up.feed(data)
            for m in up:
                self.requests.append(m)
                if m[2] in self.answers:
                    out = self.answers[m[2]](m[1])
                elif m[2] == "hello":
                    out = msgpack.packb([1, m[1], None, HELLO])
                elif m[2] == "ping":  # the data echoed
                    out = msgpack.packb([1, m[1], None, {
                        "data": m[3][0]["data"] if m[3] else b""}])
                else:
                    out = msgpack.packb([1, m[1], None, {}])
                if out is None:  # the daemon closes the connection instead
                    self.conn.shutdown(socket.SHUT_RDWR)
                    return
                try:
                    self.conn.sendall(out)
                except OSError:
                    return

    def close(self):
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()
        self.srv.close()
        self.thread.join(TIMEOUT)


def answer(result=None, error=None):
    return lambda msgid: msgpack.packb([1, msgid, error, result])


def limits(**kw):
    return dict(HELLO, limits=dict(HELLO["limits"], **kw))


@pytest.fixture()
def fake(tmp_path):
    made = []

    def make(answers):
        f = Fake(str(tmp_path / ("fake%d.sock" % len(made))), answers)
        made.append(f)
        return f
    yield make
    for f in made:
        f.close()


@pytest.mark.parametrize("result", [
    dict(HELLO, limits="big"),                       # limits a str
    limits(max_message="big"),                       # a limit of another type
    limits(max_message=0),                           # no message could be sent
    limits(max_message=-5),
    {k: v for k, v in HELLO.items() if k != "limits"},
    {k: v for k, v in HELLO.items() if k != "client_id"},
    dict(HELLO, daemon=5),
    None,                                            # result nil, error nil
    [1, 2],
] + [dict(HELLO, limits={k: v for k, v in LIMITS.items() if k != gone})
     for gone in LIMITS],                            # a limit missing (probe 20 C2)
    ids=["limits-str", "max_message-str", "max_message-0", "max_message-negative",
         "no-limits", "no-client_id", "daemon-int", "nil", "array"] +
    ["no-" + k for k in LIMITS])
def test_a_malformed_hello_answer_is_a_protocol_error(fake, result):
    f = fake({"hello": answer(result)})
    # python.md: "after `connect() to dspkd at PATH: ` as `connect()` raises it"
    with pytest.raises(dspk.ProtocolError) as ei:
        dspk.connect(f.path, timeout=TIMEOUT)
    assert ei.value.message.startswith(
        "connect() to dspkd at %s: hello (request 1): a malformed answer" % f.path), \
        ei.value.message


@pytest.mark.parametrize("hello, cls, rest", [
    (answer(error={"code": -13, "name": "EPERM", "message": "user 0 is not admitted"}),
     dspk.PermissionDenied, "user 0 is not admitted"),
    (answer(error={"code": -4, "name": "ELIMIT", "message": "more than 9 connections"}),
     dspk.LimitExceeded, "more than 9 connections"),
    (lambda msgid: b"\xc1", dspk.Closed, "undecodable data from the daemon"),
    (lambda msgid: None, dspk.Closed, "the daemon closed the connection"),
], ids=["refused-EPERM", "refused-ELIMIT", "undecodable", "closed"])
def test_every_error_of_hello_names_the_socket(fake, hello, cls, rest):
    """python.md "Connecting": an error of connect()'s hello (a malformed answer, the
    daemon's refusal; a connection closed or undecodable ends the hello the same way)
    starts with `connect() to dspkd at PATH: ` where its message does not name the
    socket already.  These errors reach connect() through the future of hello, raised
    by concurrent.futures' code: they were taken for a signal handler's and passed
    without the prefix (probe 18 C1)."""
    f = fake({"hello": hello})
    with pytest.raises(cls) as ei:
        dspk.connect(f.path, timeout=TIMEOUT)
    assert ei.value.message.startswith("connect() to dspkd at %s: %s" % (f.path, rest)), \
        ei.value.message
    assert str(ei.value).startswith(ei.value.name + ": connect() to dspkd at ")


@pytest.mark.parametrize("method, result, call", [
    ("devices", {"devices": 5, "unavailable": []}, lambda c: c.devices()),
    ("devices", {"devices": ["cpu:0"], "unavailable": []}, lambda c: c.devices()),
    ("devices", {"devices": [dict(DEVICE, id=None)], "unavailable": []},
     lambda c: c.devices()),
    ("devices", {"devices": [DEVICE], "unavailable": 1}, lambda c: c.devices(all=True)),
    ("devices", None, lambda c: c.devices()),
    ("buffer.create", {"device": "cpu:0", "size": 16}, lambda c: c.empty(4)),
    ("buffer.create", {"buffer": "x", "device": "cpu:0", "size": 16}, lambda c: c.empty(4)),
    ("buffer.create", {"buffer": 3, "device": None, "size": 16}, lambda c: c.empty(4)),
    ("buffer.create", 3, lambda c: c.empty(4)),
    ("ping", {}, lambda c: c.ping()),
    ("ping", None, lambda c: c.ping(b"x")),
    ("status", [1], lambda c: c.status()),
    ("task.run", {"outputs": [{"dtype": "i32", "shape": [4], "data": b"\0" * 16}]},
     lambda c: c.map("scale", np.ones(4, np.float32), alpha=2.0)),
    ("task.run", 5, lambda c: c.map("scale", np.ones(4, np.float32), alpha=2.0)),
], ids=["devices-int", "device-str", "device-id-nil", "unavailable-int", "devices-nil",
        "no-buffer", "buffer-str", "device-nil", "buffer.create-int", "ping-no-data",
        "ping-nil", "status-array", "task.run-dtype", "task.run-int"])
def test_a_malformed_answer_fails_its_call_with_protocol_error(fake, method, result, call):
    f = fake({method: answer(result)})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError, match="a malformed answer|unknown dtype"):
            call(c)
        assert not c.closed  # the stream is whole: the connection stays usable
        if method != "ping":
            assert c.ping() >= 0


F32_2 = {"dtype": "f32", "shape": [2], "data": b"\0" * 8}


@pytest.mark.parametrize("outputs, path", [
    (None, "result.outputs is NoneType None, not a array"),
    ([], "result.outputs has 0 items, not 1"),
    ([F32_2, F32_2], "result.outputs has 2 items, not 1"),
    ([5], r"result.outputs\[0\] is int 5, not a map"),
    ([{"dtype": "f32", "shape": [2]}], r"result.outputs\[0\] has neither data nor buffer"),
    ([{"shape": [2], "data": b"\0" * 8}], r"result.outputs\[0\].dtype is missing"),
    ([dict(F32_2, dtype=3)], r"result.outputs\[0\].dtype is int 3, not a str"),
    ([dict(F32_2, dtype="i32")],
     r"result.outputs\[0\].dtype is 'i32', a dtype the client does not know"),
    ([dict(F32_2, shape=2)], r"result.outputs\[0\].shape is int 2, not a array"),
    ([dict(F32_2, shape=[2.0])], r"result.outputs\[0\].shape\[0\] is float 2.0, not a uint"),
    ([dict(F32_2, shape=[-1])], r"result.outputs\[0\].shape\[0\] is int -1, not a uint"),
    ([dict(F32_2, data="ab")], r"result.outputs\[0\].data is str 'ab', not a bin"),
    ([dict(F32_2, data=b"\0" * 4)], r"result.outputs\[0\].data is 4 bytes, not the 8 of f32"),
    ([{"dtype": "f32", "shape": [2], "buffer": "x"}],
     r"result.outputs\[0\].buffer is str 'x', not a uint"),
    ([{"dtype": "f32", "shape": [2], "buffer": 3, "offset": -1}],
     r"result.outputs\[0\].offset is int -1, not a uint"),
    ([{"dtype": "f64", "shape": [2], "data": b"\0" * 16}],
     r"result.outputs\[0\] is f64 \(2,\), where map of these operands gives f32 \(2,\)"),
    ([{"dtype": "f32", "shape": [1, 2], "data": b"\0" * 8}],
     r"result.outputs\[0\] is f32 \(1, 2\), where map of these operands gives f32 \(2,\)"),
    ("x", "result is str 'x', not a map"),
])
def test_a_malformed_task_run_answer_names_the_request_and_the_field(fake, outputs, path):
    result = outputs if isinstance(outputs, str) else \
        {"device": "cpu:0", "time_us": 1, "outputs": outputs}
    f = fake({"task.run": answer(result)})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError,
                           match=r"^EPROTO: task.run \(request \d+\): a malformed answer: "
                                 + path) as ei:
            c.map("abs", np.ones(2, np.float32))
        assert "Error:" not in str(ei.value)  # no Python internals (KeyError: ...)
        assert c.ping() >= 0  # the connection stays usable


def test_a_well_formed_task_run_answer_passes_the_checks(fake):
    f = fake({"task.run": answer({"device": "cpu:0", "time_us": 1, "outputs": [
        {"dtype": "f32", "shape": [2], "data": np.float32([1, 2]).tobytes()}]})})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        assert c.map("abs", np.ones(2, np.float32)).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("result, path", [
    ({}, "result.data is missing"),
    ({"data": 5}, "result.data is int 5, not a bin"),
    ({"data": b"\0" * 3}, "result.data is 3 bytes, not the 16 asked"),
    (None, "result is NoneType None, not a map"),
])
def test_a_malformed_buffer_read_answer_names_the_field(fake, result, path):
    f = fake({"buffer.create": answer({"buffer": 3, "device": "cpu:0", "size": 16}),
              "buffer.read": answer(result)})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        d = c.empty(4)
        with pytest.raises(dspk.ProtocolError, match=r"^EPROTO: buffer.read \(request \d+\): "
                                                     r"a malformed answer: " + path):
            d.numpy()
        assert c.ping() >= 0


def test_a_malformed_buffer_answer_naming_a_buffer_frees_it(fake):
    f = fake({"buffer.create": answer({"buffer": 9, "device": 5, "size": 16})})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError):
            c.empty(4)
        c._call("ping")  # the owed free goes before it
    assert [m[3] for m in f.requests if m[2] == "buffer.free"] == [[{"buffer": 9}]]


def test_an_error_that_is_no_map_is_a_protocol_error(fake):
    f = fake({"ping": answer(error="bad")})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError, match="its error is str 'bad', not a map"):
            c.ping()


@pytest.mark.parametrize("raw", [
    lambda msgid: msgpack.packb(5),
    lambda msgid: msgpack.packb([1, msgid]),
    lambda msgid: msgpack.packb([1, msgid, None, {}, 0]),
    lambda msgid: msgpack.packb([1, "x", None, {}]),
    lambda msgid: msgpack.packb([2, "task.progress"]),
    lambda msgid: msgpack.packb(msgpack.ExtType(5, b"abc")),
    lambda msgid: msgpack.packb([1, msgid, None, {"data": msgpack.ExtType(1, b"")}]),
], ids=["int", "cut", "five", "msgid-str", "notification-cut", "ext", "ext-inside"])
def test_a_message_that_is_no_protocol_message_closes_the_connection(fake, raw):
    f = fake({"ping": raw})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.Closed, match="the daemon sent .*; the connection is closed"):
            c.ping()  # not a wait for ever (nor a dspk.Timeout after TIMEOUT)
        assert c.closed
        with pytest.raises(dspk.Closed):
            c.ping()


@pytest.mark.parametrize("bad", [
    [0, 5, "x", []], [3, 1, None, {}], "str", [1, "a", None, {}], [2, 5, []]],
    ids=["request", "kind-3", "str", "msgid-str", "method-int"])
@pytest.mark.parametrize("split", [False, True], ids=["one-send", "two-sends"])
def test_no_answer_after_a_message_that_is_no_protocol_message_is_taken(fake, bad, split):
    """The stream is broken at the bad message: the well-formed answer sent after it
    (in the same send or the next) does not complete the call, which raises
    dspk.Closed (python.md, Connecting: "rather than be skipped while its call
    waits"); before probe 20 C1 the ping returned that answer."""
    def raw(msgid):
        good = msgpack.packb([1, msgid, None, {"data": b""}])
        if not split:
            return msgpack.packb(bad) + good
        f.conn.sendall(msgpack.packb(bad))
        return good
    f = fake({"ping": raw})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.Closed, match="the daemon sent .*; the connection is closed"):
            c.ping()
        assert c.closed


@pytest.mark.parametrize("err, text", [
    ("oops", "str 'oops'"), (None, "NoneType None"), (5, "int 5"), ([1], "list [1]"),
    (b"x" * 50, "bytes b'" + "x" * 35 + "...")])
def test_error_from_a_value_that_is_no_map_is_a_protocol_error(err, text):
    """dspk.error_from() of what is no error map returns ProtocolError saying so, as the
    client raises for such an answer; it raised a bare AttributeError (probe 20 C4b)."""
    got = dspk.error_from(err)
    assert type(got) is dspk.ProtocolError
    assert got.message == "an error that is not a map: " + text, got.message


def test_an_answer_with_both_error_and_result_is_a_protocol_error(fake):
    """protocol.md: exactly one of error and result is nil.  An answer with both set is
    malformed: ProtocolError saying so, from connect() for hello (it raised the error
    map's class with an empty message, probe 20 C4d) and from any other call."""
    err = {"code": -1, "name": "EINVAL", "message": ""}
    f = fake({"hello": answer(HELLO, error=err)})
    with pytest.raises(dspk.ProtocolError) as ei:
        dspk.connect(f.path, timeout=TIMEOUT)
    assert ei.value.message == "connect() to dspkd at %s: hello (request 1): a malformed " \
        "answer: both its error and its result are set" % f.path, ei.value.message
    f = fake({"ping": answer({"data": b""}, error=err)})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError, match=r"^EPROTO: ping \(request \d+\): a "
                           "malformed answer: both its error and its result are set$"):
            c.ping()
        assert not c.closed  # only that call failed


def test_a_well_formed_devices_answer_passes_the_checks(fake):
    """The control: protocol.md's devices answer is taken as it is."""
    f = fake({"devices": answer({"devices": [DEVICE], "unavailable": []})})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        assert c.devices() == [DEVICE]
        assert c.devices(all=True) == [DEVICE]


def test_a_string_that_is_not_utf8_is_read_with_replacement_characters(fake):
    """A daemon's string of bytes that are not UTF-8 (an error message here) reads with
    U+FFFD for each bad byte, as the message of the call's error: it closed the
    connection (UnicodeDecodeError in the reader)."""
    def bad(msgid):
        raw = msgpack.packb([1, msgid, {"code": -1, "name": "EINVAL", "message": "XXX"}, None])
        return raw.replace(b"\xa3XXX", b"\xa3\xff\xfeA")
    f = fake({"ping": bad})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.InvalidArgument) as e:
            c.ping()
        assert e.value.message == "\ufffd\ufffdA"
        with pytest.raises(dspk.InvalidArgument):  # the connection goes on
            c.ping()

def _bad_utf8(msg, marks):
    """msg packed, each placeholder of ``marks`` (bytes) replaced by bytes that are no
    UTF-8 (their str header keeps their length)."""
    raw = msgpack.packb(msg)
    for mark, bad in marks.items():
        assert len(mark) == len(bad) and raw.count(mark) == 1
        raw = raw.replace(mark, bad)
    return raw


def test_text_that_is_not_utf8_decodes_with_replacement_characters(fake):
    """A device name or an error message holding bytes that are no UTF-8 raised
    UnicodeDecodeError inside the decoder, which closed the connection ("undecodable
    data").  Now such text decodes as bytes.decode(errors="replace") does (U+FFFD for
    each bad byte here) and the connection stays usable."""
    name = b"gpu\xff\xfe-\xc3(x"          # 0xff, 0xfe, and a cut 2-byte sequence
    msg = b"bad \x80 operand"
    dev = dict(DEVICE, name="N" * len(name))
    f = fake({
        "devices": lambda msgid: _bad_utf8([1, msgid, None, {"devices": [dev],
                                                             "unavailable": []}],
                                           {b"N" * len(name): name}),
        "status": lambda msgid: _bad_utf8([1, msgid, {"code": -1, "name": "EINVAL",
                                                      "message": "M" * len(msg)}, None],
                                          {b"M" * len(msg): msg}),
    })
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        got = c.devices()
        assert got[0]["name"] == name.decode("utf-8", "replace") == "gpu\ufffd\ufffd-\ufffd(x"
        with pytest.raises(dspk.InvalidArgument) as e:
            c.status()
        assert e.value.message == "bad \ufffd operand"
        assert not c.closed
        assert c.ping() >= 0  # the connection is still usable


def test_callbacks_run_on_their_own_thread_and_may_wait(fake):
    """Done-callbacks and progress callbacks ran on the thread reading the connection:
    one that waited for another thread's call (or called the client and waited for a
    future of another thread's) stopped the reading, and that call deadlocked (here:
    dspk.Timeout).  Now they run in order on the client's dspk-callbacks thread;
    progress still comes before the future completes, and a callback may call the
    client and wait."""
    out = {"dtype": "f32", "shape": [2], "data": np.array([1, 2], np.float32).tobytes()}

    def run(msgid):  # a progress notification, then the answer, in one write
        return msgpack.packb([2, "task.progress", [{"msgid": msgid, "what": "tune",
                                                    "fraction": 0.5}]]) + \
            msgpack.packb([1, msgid, None, {"device": "cpu:0", "outputs": [out],
                                            "time_us": 1}])
    f = fake({"task.run": run})
    with dspk.connect(f.path, timeout=10) as c:
        go, done = threading.Event(), threading.Event()
        seen = []

        def progress(what, frac):
            seen.append(("progress", threading.current_thread().name, fut.done()))
            assert go.wait(TIMEOUT)  # waits for the main thread's ping below

        def callback(g):
            seen.append(("done", threading.current_thread().name, g.done()))
            # a synchronous call, and a submit() waited for, from the callback
            seen.append(("ping", c.ping() >= 0))
            h = c.submit("map", "abs", np.ones(2, np.float32), progress=lambda w, x: seen
                         .append(("progress", threading.current_thread().name, h.done())))
            seen.append(("nested", h.result(TIMEOUT).tolist()))
            done.set()

        fut = c.submit("map", "abs", np.ones(2, np.float32), progress=progress)
        fut.add_done_callback(callback)
        assert c.ping() >= 0   # deadlocked while progress held the reading thread
        go.set()
        np.testing.assert_array_equal(fut.result(TIMEOUT), [1, 2])
        assert done.wait(TIMEOUT)
        assert seen == [("progress", "dspk-callbacks", False),
                        ("done", "dspk-callbacks", True), ("ping", True),
                        ("progress", "dspk-callbacks", False), ("nested", [1, 2])]


# protocol.md's error codes and python.md's table of classes (and builtins they derive from)
ERRORS = [(-1, "EINVAL", "InvalidArgument", ValueError), (-2, "ENOMEM", "OutOfMemory",
          MemoryError), (-3, "EPROTO", "ProtocolError", None),
          (-4, "ELIMIT", "LimitExceeded", None), (-5, "ENOMETHOD", "NoMethod", None),
          (-6, "ENODEV", "NoDevice", None), (-7, "EDTYPE", "DtypeError", TypeError),
          (-8, "ESHAPE", "ShapeError", ValueError), (-9, "ENOBUF", "NoBuffer", None),
          (-10, "ERANGE", "RangeError", IndexError), (-11, "ECANCELED", "Canceled", None),
          (-12, "ESHUTDOWN", "Shutdown", None), (-13, "EPERM", "PermissionDenied",
          PermissionError), (-14, "EIO", "IOFailure", None),
          (-15, "ECLOSED", "Closed", ConnectionError),
          (-16, "ECONNECT", "ConnectError", ConnectionError),
          (-17, "EDEVICE", "DeviceError", None), (-18, "ECOMPILE", "CompileError", None),
          (-19, "ENOTSUP", "NotSupported", NotImplementedError), (-20, "EBUSY", "Busy", None),
          (-21, "ETIMEDOUT", "Timeout", TimeoutError), (-22, "ENOENT", "NotFound", None),
          (-23, "EVERSION", "VersionMismatch", None),
          (-24, "EINTERNAL", "InternalError", None)]


def test_every_error_code_raises_its_class(fake):
    """Each code of protocol.md's table, answered by the daemon, raises python.md's
    subclass (ENOMEM: dspk.OutOfMemory, a MemoryError), with the code, name and message
    as sent; an error map with a name but no integer code maps by its name (it was
    InternalError)."""
    from dspk import _errors
    assert len(ERRORS) == len(_errors._TABLE)
    for code, name, cls_name, builtin in ERRORS:
        f = fake({"status": answer(error={"code": code, "name": name, "message": "m " + name})})
        with dspk.connect(f.path, timeout=TIMEOUT) as c:
            with pytest.raises(getattr(dspk, cls_name)) as e:
                c.status()
            assert type(e.value) is getattr(dspk, cls_name)
            assert (e.value.code, e.value.name, e.value.message) == (code, name, "m " + name)
            assert builtin is None or isinstance(e.value, builtin)
            assert not c.closed
        for err in ({"name": name, "message": "x"}, {"code": str(code), "name": name},
                    {"code": True, "name": name}):
            got = dspk.error_from(err)
            assert type(got) is getattr(dspk, cls_name) and got.code == code, (err, got)
    assert isinstance(dspk.error_from({"code": -2, "name": "ENOMEM"}), MemoryError)
    assert type(dspk.error_from({"code": -99, "name": "EWHAT"})) is dspk.Error
    assert type(dspk.error_from({"name": "EWHAT"})) is dspk.InternalError


@pytest.mark.parametrize("err, cls, code, name, message", [
    # a code of the table: its class and its own name, whatever name came with it
    ({"code": -3, "name": "EINVAL", "message": "m"}, "ProtocolError", -3, "EPROTO", "m"),
    ({"code": -13, "name": b"EPERM", "message": b"bin msg"}, "PermissionDenied", -13,
     "EPERM", "bin msg"),
    ({"code": -1, "message": b"bad \xff utf-8"}, "InvalidArgument", -1, "EINVAL",
     "bad \ufffd utf-8"),
    ({"code": -8, "name": 7, "message": 7}, "ShapeError", -8, "ESHAPE", "7"),
    # a code outside the table: a plain Error keeping code and name, "EUNKNOWN"
    # (libdspkclient's dspk_err_name) where none came or one of another code did
    ({"code": 5}, "Error", 5, "EUNKNOWN", ""),
    ({"code": -99, "name": "EINVAL", "message": "x"}, "Error", -99, "EUNKNOWN", "x"),
    ({"code": -99, "name": b"EWHAT", "message": "x"}, "Error", -99, "EWHAT", "x"),
    # no integer code: by its name (bin too), else InternalError with its own name
    ({"name": b"ENOMEM", "message": b"m"}, "OutOfMemory", -2, "ENOMEM", "m"),
    ({"name": b"\xff\xfe", "message": "m"}, "InternalError", -24, "EINTERNAL", "m"),
    ({"name": "", "message": None}, "InternalError", -24, "EINTERNAL", ""),
], ids=["code-vs-name", "bin-name-message", "bad-utf8", "non-text", "unknown-no-name",
        "unknown-table-name", "unknown-bin-name", "bin-name-only", "bad-utf8-name",
        "empty"])
def test_an_error_map_maps_to_consistent_code_and_name(fake, err, cls, code, name, message):
    """python.md "Errors": the class, code and .name always agree (a name is never
    invented, "E-5", nor kept against its code, ProtocolError "EINVAL"), and text sent as
    msgpack bin or not valid UTF-8 decodes with U+FFFD, never as a bytes repr "b'...'"
    (probe 18 C4).  Checked through a fake daemon's answer and error_from alike."""
    def check(e):
        assert type(e) is getattr(dspk, cls), e
        assert (e.code, e.name, e.message) == (code, name, message)
        assert str(e) == ("%s: %s" % (name, message) if message else name)
    check(dspk.error_from(err))
    f = fake({"status": lambda msgid: msgpack.packb([1, msgid, err, None], use_bin_type=True)})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.Error) as ei:
            c.status()
        check(ei.value)
        assert not c.closed


def test_undecodable_bytes_say_so_with_an_empty_reason(fake):
    """msgpack's FormatError for a reserved byte has no text: the message says that,
    never a bare "(FormatError: )" (probe 18 C4)."""
    f = fake({"status": lambda msgid: b"\xc1"})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.Closed) as ei:
            c.status()
        assert "undecodable data from the daemon (FormatError (with no message))" \
            in ei.value.message, ei.value.message
        assert ": )" not in ei.value.message


@pytest.mark.parametrize("where", ["this thread", "another thread"])
def test_exception_returns_the_connection_error_of_a_pending_future(fake, where):
    """The daemon goes away with a submit() pending: exception() returns dspk.Closed,
    never raises it (concurrent.futures' contract), also on a thread that reads the
    connection itself (the reader thread ended as it closed) before the thread that
    found it closed has failed the pending calls (held here: _fail_all deferred)."""
    f = fake({"task.run": lambda msgid: b""})  # never answered
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        fut = c.submit("map", "abs", np.ones(2, np.float32))
        fail_all, held = c._fail_all, []
        c._fail_all = lambda: held.append(1)  # the pending calls fail later
        f.close()
        deadline = time.monotonic() + TIMEOUT  # it finds the connection closed and ends
        while c._thread is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held and c._thread is None and not fut.done()
        got = []

        def call():
            try:
                got.append(fut.exception(timeout=TIMEOUT))
            except BaseException as e:  # noqa: BLE001 - what the test is about
                got.append(("raised", e))
        if where == "this thread":
            call()
        else:
            t = threading.Thread(target=call)
            t.start()
            t.join(TIMEOUT)
        assert len(got) == 1 and isinstance(got[0], dspk.Closed), got
        with pytest.raises(dspk.Closed):
            fut.result(timeout=TIMEOUT)
        fail_all()  # the deferred failing finds it done: no harm
        assert fut.exception() is got[0]


@pytest.mark.parametrize("output, path", [
    ({"dtype": "f64", "shape": [64, 64], "buffer": 3},
     r"result.outputs\[0\] is f64 \(64, 64\), where gemm of these operands gives f32 "
     r"\(64, 64\)"),
    ({"dtype": "f32", "shape": [64, 64]}, r"result.outputs\[0\] has neither data nor buffer"),
    (None, r"result.outputs\[0\] is NoneType None, not a map"),
])
def test_a_malformed_staged_task_run_answer_names_the_request_and_the_field(fake, output,
                                                                             path):
    """A result too large for one message comes back through a temporary buffer (the
    staged path): its answer is checked as an inline one, and the temporary freed."""
    f = fake({"hello": answer(limits(max_message=8192)),
              "buffer.create": answer({"buffer": 3, "device": "cpu:0", "size": 16384}),
              "task.run": answer({"device": "cpu:0", "time_us": 1, "outputs": [output]})})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError,
                           match=r"^EPROTO: task.run \(request \d+\): a malformed answer: "
                                 + path):
            c.gemm(np.ones((64, 1), np.float32), np.ones((1, 64), np.float32))
        c._call("ping")  # the owed free goes before it
    assert [m[3] for m in f.requests if m[2] == "buffer.free"] == [[{"buffer": 3}]]


@pytest.mark.parametrize("outputs, path", [
    ([F32_2], r"result.outputs has 1 items, not 2"),
    ([F32_2, {"dtype": "f32", "shape": [3], "data": b"\0" * 12}],
     r"result.outputs\[1\] is f32 \(3,\), where kernel of these operands gives f32 \(2,\)"),
    ([F32_2, dict(F32_2, dtype="f64", data=b"\0" * 16)],
     r"result.outputs\[1\] is f64 \(2,\), where kernel of these operands gives f32 \(2,\)"),
])
def test_a_malformed_kernel_answer_names_the_request_and_the_field(fake, outputs, path):
    """kernel's answer gives back every tensor as it was passed: one of another count,
    dtype or shape is named."""
    gpu = dict(DEVICE, id="vulkan:0", backend="vulkan", kernel_langs=["glsl"])
    f = fake({"devices": answer({"devices": [DEVICE, gpu], "unavailable": []}),
              "task.run": answer({"device": "vulkan:0", "time_us": 1, "outputs": outputs})})
    with dspk.connect(f.path, timeout=TIMEOUT) as c:
        with pytest.raises(dspk.ProtocolError,
                           match=r"^EPROTO: task.run \(request \d+\): a malformed answer: "
                                 + path):
            c.kernel("void main() {}", np.ones(2, np.float32), np.ones(2, np.float32),
                     lang="glsl", grid=1, device="vulkan:0")
        f.answers["task.run"] = answer({"device": "vulkan:0", "time_us": 1,
                                        "outputs": [F32_2, F32_2]})
        got = c.kernel("void main() {}", np.ones(2, np.float32), np.ones(2, np.float32),
                       lang="glsl", grid=1, device="vulkan:0")  # well-formed: taken
        assert [g.tolist() for g in got] == [[0.0, 0.0], [0.0, 0.0]]


def _error_samples():
    from dspk import _errors
    out = [cls("text of %s" % cls.__name__) for cls in
           (getattr(dspk, n) for n in _errors.__all__ if n not in ("Error", "error_from"))]
    out += [dspk.Error("plain"), dspk.Error(), dspk.Error("x", code=-99, name="EWEIRD"),
            dspk.error_from({"code": -99, "message": "unknown"}),
            dspk.error_from({"name": "ENOMEM"}), dspk.error_from({}),
            dspk.error_from({"code": -8, "name": "EINVAL", "message": "m"})]
    return out


def test_errors_pickle_and_copy_as_builtin_exceptions():
    """pickle, copy and deepcopy of a dspk error keep, as for a builtin exception, its
    class, args, code, name, message, str, the notes of add_note() and the attributes
    a caller set (its __dict__): the notes and attributes were dropped, and a
    dspk.Error built directly came back as InternalError (probe 22 C2)."""
    import copy
    import pickle
    for e in _error_samples():
        e.add_note("a note")
        e.extra = {"k": 5}
        hows = [lambda x, p=p: pickle.loads(pickle.dumps(x, protocol=p))
                for p in range(pickle.HIGHEST_PROTOCOL + 1)] + [copy.copy, copy.deepcopy]
        for how in hows:
            back = how(e)
            assert back is not e
            assert type(back) is type(e), (e, back)
            assert (back.args, back.code, back.name, back.message, str(back)) == \
                (e.args, e.code, e.name, e.message, str(e)), (e, back)
            assert back.__notes__ == ["a note"] and back.extra == {"k": 5}, e
            assert back.__dict__ == e.__dict__, (e, back.__dict__)
    # the builtin's behaviour, which this follows
    v = ValueError("v")
    v.add_note("a note")
    v.extra = 1
    assert pickle.loads(pickle.dumps(v)).__dict__ == v.__dict__


def test_error_built_directly_is_an_error_of_code_einternal():
    """dspk.Error("text") built directly (no code) has the code -24 and name
    EINTERNAL of an internal error but stays of class Error, not InternalError,
    through pickle and copy too (python.md, Errors)."""
    import copy
    import pickle
    e = dspk.Error("plain")
    assert (type(e), e.code, e.name, e.message, str(e)) == \
        (dspk.Error, -24, "EINTERNAL", "plain", "EINTERNAL: plain")
    assert not isinstance(e, dspk.InternalError)
    for back in (pickle.loads(pickle.dumps(e)), copy.copy(e), copy.deepcopy(e)):
        assert type(back) is dspk.Error and (back.code, back.name) == (-24, "EINTERNAL")
    assert type(dspk.error_from({"code": -24})) is dspk.InternalError


def test_pickles_of_an_earlier_client_still_load():
    """An error pickled by a client before this one (``_rebuild(code, name,
    message)``) loads, as error_from makes it."""
    from dspk._errors import _rebuild
    e = _rebuild(-8, "ESHAPE", "old")
    assert type(e) is dspk.ShapeError and e.message == "old"
