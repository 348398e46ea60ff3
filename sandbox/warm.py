"""Host side of a warm sandbox: one bubblewrap'd fork server (`sandbox/forkserver.py`) per workspace.

A warm call costs a fork inside an already-running sandbox instead of a bubblewrap start plus an
interpreter start (see `bench/sandbox_bench.py` for the numbers). The host keeps its own deadline,
the call's wall limit plus `kill_grace_s`: if the server misses it or dies (the agent's program
can kill it, it runs as the same uid), the host kills the whole sandbox, reports the call as
killed by "sandbox" or "wall_clock", and the next call starts a fresh server on the same
workspace. A server that never becomes ready is an infrastructure failure (EnvInfraError).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import struct
import subprocess
import time
from pathlib import Path

from sandbox.api import EnvInfraError, InfraErrorClass
from sandbox.isolation import ExecResult, Isolator, Limits, classify, kill_tree, spawn

SERVER_MOUNT = "/.orrery/forkserver.py"
STARTUP_TIMEOUT_S = 30.0


class WarmServer:
    """A lazily (re)started fork server over one workspace."""

    def __init__(self, isolator: Isolator, workspace: Path, uid: int | None, log_path: Path):
        assert isolator.isolated, "the fork server sweeps its pid namespace: bwrap only"
        self.isolator = isolator
        self.workspace = workspace
        self.uid = uid
        self.log_path = log_path
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._buffer = b""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self.stop()
        script = self.isolator.root / "forkserver.py"
        argv = self.isolator.bwrap_argv(self.workspace, extra_ro=[(str(script), SERVER_MOUNT)])
        argv += [self.isolator.config.python_executable, "-E", "-s", SERVER_MOUNT]
        with open(self.log_path, "ab") as log_file:
            self._proc = spawn(argv, limits=None, uid=self.uid, stdin=subprocess.PIPE, stderr=log_file)
        self._ready, self._buffer = False, b""

    def kill(self) -> None:
        """SIGKILL the sandbox now; `stop()` later reaps it."""
        if self._proc is not None:
            kill_tree(self._proc)

    def stop(self) -> None:
        if self._proc is not None:
            kill_tree(self._proc)
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
            self._proc = None

    def _read_message(self, deadline: float) -> dict | None:
        """The next reply, or None on EOF or when `deadline` passes."""
        fd = self._proc.stdout.fileno()
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack(">I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    body, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                    return json.loads(body)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk

    def ensure_ready(self) -> None:
        if not self.alive:
            self.start()
        if self._ready:
            return
        hello = self._read_message(time.monotonic() + STARTUP_TIMEOUT_S)
        if not hello or not hello.get("ready"):
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-500:] if self.log_path.exists() else ""
            raise EnvInfraError(InfraErrorClass.SANDBOX_CRASH, f"warm sandbox server failed to start: {tail}")
        self._ready = True

    def call(self, request: dict, limits: Limits) -> ExecResult:
        """Run one request ({"argv": [...]} or {"code": "..."}) under `limits`. Never raises for the program."""
        self.ensure_ready()
        started = time.monotonic()
        body = json.dumps({**request, "limits": dataclasses.asdict(limits)}).encode()
        try:
            self._proc.stdin.write(struct.pack(">I", len(body)) + body)
            self._proc.stdin.flush()
            reply = self._read_message(started + limits.wall_s + self.isolator.config.kill_grace_s)
        except (BrokenPipeError, OSError):
            reply = None
        if reply is None:
            # The agent killed or stopped the server, or it overran: the whole sandbox goes.
            overran = time.monotonic() - started >= limits.wall_s
            self.stop()
            return ExecResult(exit_status=137, timed_out=overran, killed_by="wall_clock" if overran else "sandbox",
                              stderr="[the sandbox was killed]", wall_s=time.monotonic() - started)
        killed_by = classify(reply["exit_status"], reply["stderr"], reply["killed_by"])
        return ExecResult(reply["stdout"], reply["stderr"], reply["exit_status"], reply["killed_by"] == "wall_clock",
                          killed_by, time.monotonic() - started, reply["cpu_s"], reply["truncated"])
