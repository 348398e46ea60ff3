"""The warm server that runs INSIDE one sandbox: forks a child per tool call. Standard library only.

Started by `sandbox/warm.py` as `python3 -E -s forkserver.py` under bubblewrap, as the sandbox
uid. It speaks length-prefixed JSON on its original stdin/stdout, which it moves to private fds
first so no child inherits them. For each request it forks a child that starts a new session,
applies the call's rlimits, and then either execs a command or runs Python source in-process
(no interpreter start: this is what makes warm calls cheap). The server enforces the deadline and
the output caps, and after every call kills every process in the sandbox's pid namespace except
init (pid 1) and itself, so nothing the agent started outlives its call.

This file is untrusted-side code: the agent's programs run as the same uid and can tamper with
this process. The host therefore treats its replies as the agent's own output (never as a
verdict) and keeps its own deadline (see `sandbox/warm.py`).
"""

import io
import json
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback

PROTOCOL_IN = os.dup(0)
PROTOCOL_OUT = os.dup(1)
_devnull = os.open("/dev/null", os.O_RDWR)
os.dup2(_devnull, 0)
os.dup2(_devnull, 1)
os.close(_devnull)


def read_message():
    header = _read_exact(4)
    if header is None:
        return None
    body = _read_exact(struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body)


def _read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(PROTOCOL_IN, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def write_message(obj):
    body = json.dumps(obj).encode()
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(PROTOCOL_OUT, data):]


def sweep():
    """Kill every process in this pid namespace but init and me; repeat until none is left."""
    me = os.getpid()
    for _ in range(100):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.002)


def _child(req, stdin_r, out_w, err_w):
    os.setsid()
    os.dup2(stdin_r, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, 1 << 16)
    lim = req["limits"]
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_size_bytes"], lim["file_size_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"], lim["max_processes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_open_files"], lim["max_open_files"]))
    if "argv" in req:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.execv(req["argv"][0], req["argv"])
    # Python source, run like `python3 -c`: fresh __main__ globals, the cwd first on sys.path.
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    sys.argv = ["-c"]
    sys.path[0] = ""
    code = 0
    try:
        exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 120
    os._exit(code)


def run(req):
    started = time.monotonic()
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child(req, stdin_r, out_w, err_w)
        finally:
            os._exit(127)
    for fd in (stdin_r, out_w, err_w):
        os.close(fd)
    stdin_data = req.get("stdin", "").encode()
    if stdin_data:
        try:
            os.write(stdin_w, stdin_data[:65536])
        except OSError:
            pass
    os.close(stdin_w)
    cap = req["limits"]["max_output_bytes"]
    deadline = started + req["limits"]["wall_s"]
    buffers = {out_r: bytearray(), err_r: bytearray()}
    pidfd = os.pidfd_open(pid)
    watched = [out_r, err_r, pidfd]
    killed_by, truncated, exited_at = "", False, None
    while True:
        now = time.monotonic()
        pipes_open = out_r in watched or err_r in watched
        if exited_at is not None and (not pipes_open or now - exited_at > 0.2):
            break
        if now >= deadline:
            if not killed_by:
                killed_by = "wall_clock"
            break
        ready, _, _ = select.select(watched, [], [], min(deadline - now, 0.05))
        for fd in ready:
            if fd == pidfd:
                watched.remove(pidfd)
                exited_at = time.monotonic()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                watched.remove(fd)
                continue
            buf = buffers[fd]
            room = cap - len(buf)
            buf += chunk[:max(room, 0)]
            if len(chunk) > room:
                truncated, killed_by = True, "output"
        if killed_by:
            break
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _, status, usage = os.wait4(pid, 0)
    sweep()
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    code = os.waitstatus_to_exitcode(status)
    return {
        "stdout": buffers[out_r].decode("utf-8", errors="replace"),
        "stderr": buffers[err_r].decode("utf-8", errors="replace"),
        "exit_status": 128 - code if code < 0 else code,
        "killed_by": killed_by,
        "truncated": truncated,
        "wall_s": time.monotonic() - started,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main():
    # The sweep kills every other process it can see: only ever run as the child of bwrap's init.
    with open("/proc/1/cmdline", "rb") as f:
        if os.path.basename(f.read().split(b"\0")[0]) != b"bwrap":
            sys.exit("forkserver: refusing to run outside a bubblewrap pid namespace")
    write_message({"ready": True, "pid": os.getpid()})
    while True:
        req = read_message()
        if req is None:
            return
        write_message(run(req))


if __name__ == "__main__":
    main()
