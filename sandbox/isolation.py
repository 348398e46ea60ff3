"""Run untrusted commands under bubblewrap with resource limits; every run returns an `ExecResult`.

What IS isolated (isolation="bwrap", the default):
- Namespaces: user, pid, network, ipc, uts and cgroup are all new (`--unshare-all`); the network
  namespace has only a downed loopback, so every connect fails. Nested user namespaces are
  disabled (`--disable-userns`).
- Identity: bubblewrap is started as an unprivileged host uid (`uid_base + slot`, never root) with
  no capabilities, so even a namespace escape lands as nobody in particular, and RLIMIT_NPROC
  applies (the kernel exempts root from it).
- Filesystem: a fresh root containing only read-only binds of /usr (and the /bin, /lib, /lib64,
  /sbin links), a few harmless files of /etc (dynamic-linker cache, alternatives, timezone,
  Python's Debian config) plus generated minimal /etc/passwd, /etc/group and /etc/hosts; its own
  /proc and /dev; a size-capped tmpfs on /tmp; and the private writable workspace at /workspace.
  /root, /home, /etc/shadow, the repository, the venv and other sandboxes do not exist inside.
- Lifetime: `--die-with-parent` and a parent-death signal tie the sandbox to this process (they
  are spawned from one long-lived thread, because Linux delivers the parent-death signal when the
  *spawning thread* exits); `--new-session` blocks TIOCSTI; the pid namespace means killing its
  init kills every process in it, orphans included.
- Resources: rlimits on CPU seconds, address space, file size, processes and open files; a
  wall-clock deadline after which the host kills the whole process tree; stdout and stderr are
  captured up to `max_output_bytes` each and a program writing more is killed.

What is NOT isolated:
- CPU and memory *bandwidth*, page cache and disk I/O are shared; RLIMIT_AS bounds each process,
  not the sum over a sandbox's processes (RLIMIT_NPROC bounds their count).
- Disk usage of the workspace is bounded per file (RLIMIT_FSIZE) and by the snapshot's file cap,
  not in total; /tmp is a capped tmpfs.
- The kernel is shared: a kernel exploit escapes. Timing side channels are not addressed.
- Sandboxes that happen to share a uid share the RLIMIT_NPROC budget (not each other's files).
- Within one sandbox, the agent's programs can signal or inspect the warm server (same uid); the
  host then sees the server die or miss its deadline, reports the call as killed, and starts a
  fresh server on the same workspace. Verifiers never run in the agent's sandbox.

isolation="none" (explicit opt-in only) keeps the rlimits, the uid drop, the deadline and the
output caps but has no namespaces: the program sees the host filesystem and network. Every run
logs a warning. When bubblewrap is missing and isolation="bwrap", `Isolator` refuses to start.

Exit statuses follow the shell: a program killed by signal N reports 128 + N.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import logging
import os
import resource
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Sequence

from sandbox.api import EnvInfraError, InfraErrorClass, ToolResult
from sandbox.config import SandboxConfig
from sandbox.tools import WORKSPACE_MOUNT

log = logging.getLogger(__name__)

TMPFS_BYTES = 64 << 20
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf",
              "python3", "python3.11", "mime.types")
_SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKSPACE_MOUNT, "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is required (isolation="bwrap") but cannot be used on this host."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one call."""

    wall_s: float
    cpu_s: int
    memory_bytes: int
    file_size_bytes: int
    max_processes: int
    max_open_files: int
    max_output_bytes: int

    @classmethod
    def from_config(cls, config: SandboxConfig, wall_s: float) -> "Limits":
        return cls(wall_s, config.cpu_s, config.memory_bytes, config.file_size_bytes, config.max_processes,
                   config.max_open_files, config.max_output_bytes)


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """The record of one sandboxed run: what it printed, how it ended, what it cost in time."""

    stdout: str = ""
    stderr: str = ""
    exit_status: int = 0
    timed_out: bool = False
    killed_by: str = ""  # "", "wall_clock", "cpu", "memory", "file_size", "processes", "output", "sandbox"
    wall_s: float = 0.0
    cpu_s: float = 0.0
    output_truncated: bool = False

    def tool_result(self) -> ToolResult:
        return ToolResult(output=self.stdout, error=self.stderr, exit_status=self.exit_status, duration_s=self.wall_s,
                          cpu_s=self.cpu_s, timed_out=self.timed_out, killed_by=self.killed_by)


def classify(exit_status: int, stderr: str, killed_by: str) -> str:
    """Which limit ended the program, from the host's own kill reason, the signal, or stderr evidence."""
    if killed_by:
        return killed_by
    if exit_status == 128 + signal.SIGXCPU:
        return "cpu"
    if exit_status == 128 + signal.SIGXFSZ:
        return "file_size"
    if exit_status == 0:
        return ""
    tail = stderr[-2000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail or "std::bad_alloc" in tail:
        return "memory"
    if "File too large" in tail:
        return "file_size"
    if "Resource temporarily unavailable" in tail or "fork: retry" in tail or "[Errno 11]" in tail:
        return "processes"
    return ""


# ---------------------------------------------------------------------------------------------
# spawning: one long-lived thread, rlimits and the uid drop between fork and exec

_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _preexec(limits: Limits | None, uid: int | None):
    def run() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
            resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return run


def spawn(argv: Sequence[str], *, limits: Limits | None, uid: int | None, cwd: str | None = None,
          env: dict | None = None, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start `argv` in a new session from the spawner thread, with rlimits and as `uid`."""
    def start() -> subprocess.Popen:
        return subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                                start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds),
                                preexec_fn=_preexec(limits, uid))
    return _SPAWNER.submit(start).result()


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group; under bwrap the pid namespace takes every descendant with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def live_pids_of_uid(uid: int) -> list[int]:
    """Host processes of `uid` that are not zombies."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


def settle_uid(uid: int, timeout_s: float = 2.0) -> None:
    """Wait until no process of a one-shot sandbox's uid is alive; SIGKILL stragglers after half the time.

    Outer bwrap can exit while the kernel is still tearing down the pid namespace; this makes
    the end of a cold call mean the end of every process it started.
    """
    started = time.monotonic()
    while True:
        pids = live_pids_of_uid(uid)
        if not pids:
            return
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            log.warning("uid %d still has processes %s after %.1fs", uid, pids, elapsed)
            return
        if elapsed > timeout_s / 2:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.005)


def wait_status(pid: int) -> tuple[int, float]:
    """Reap `pid`; (shell-style exit status, CPU seconds of it and its reaped descendants)."""
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return (128 - code if code < 0 else code), usage.ru_utime + usage.ru_stime


def capture(proc: subprocess.Popen, limits: Limits, started: float) -> ExecResult:
    """Read stdout/stderr of `proc` under the deadline and caps, then reap it. Never raises for the program."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in buffers:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ)
    deadline = started + limits.wall_s
    killed_by, exited_at, truncated = "", None, False
    try:
        while True:
            now = time.monotonic()
            pipes_open = any(fd in buffers for fd in sel.get_map())
            if exited_at is not None and (not pipes_open or now - exited_at > 0.2):
                break  # exited; pipes drained, or held open by an escaped descendant (killed below)
            if now >= deadline and not killed_by:
                killed_by = "wall_clock"
                kill_tree(proc)
                deadline = now + 5.0  # bound the drain after the kill too
            elif now >= deadline:
                break
            for key, _ in sel.select(timeout=max(0.0, min(deadline - now, 0.05))):
                fd = key.fd
                if fd == pidfd:
                    sel.unregister(pidfd)
                    exited_at = time.monotonic()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = buffers[fd]
                room = limits.max_output_bytes - len(buf)
                buf += chunk[:max(room, 0)]
                if len(chunk) > room and not killed_by:
                    truncated, killed_by = True, "output"
                    kill_tree(proc)
    finally:
        kill_tree(proc)
        sel.close()
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    exit_status, cpu_s = wait_status(proc.pid)
    proc.returncode = exit_status
    stdout = buffers[out_fd].decode("utf-8", errors="replace")
    stderr = buffers[err_fd].decode("utf-8", errors="replace")
    return ExecResult(stdout, stderr, exit_status, killed_by == "wall_clock", classify(exit_status, stderr, killed_by),
                      time.monotonic() - started, cpu_s, truncated)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` whole (mode 0644): other processes sharing root_dir may be binding it right now."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.replace(path)


def _feed(pipe, data: bytes) -> None:
    """Write a program's stdin from a side thread: a program that never reads cannot block the host."""
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


# ---------------------------------------------------------------------------------------------
# the isolator: builds bwrap command lines and runs one-shot ("cold") commands


class Isolator:
    """Builds and runs sandboxed commands for one `SandboxConfig`. Validates the host at construction."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.root = Path(config.root_dir)
        if config.isolation == "bwrap":
            if not os.access(config.bwrap_path, os.X_OK):
                raise SandboxUnavailableError(
                    f"SandboxConfig.bwrap_path {config.bwrap_path!r} is not an executable: install bubblewrap "
                    "(Debian: apt-get install bubblewrap) or set isolation='none' to run untrusted code "
                    "WITHOUT namespaces")
        if not os.access(config.python_executable, os.X_OK):
            raise SandboxUnavailableError(f"SandboxConfig.python_executable {config.python_executable!r} is missing")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # sandbox uids may traverse to their workspace, not list others
        if os.geteuid() == 0:
            for parent in self.root.resolve().parents:
                if not os.stat(parent).st_mode & 0o001:
                    raise SandboxUnavailableError(
                        f"SandboxConfig.root_dir {config.root_dir!r}: its parent {str(parent)!r} is not searchable "
                        "by other users, so the unprivileged sandbox uids cannot reach their workspaces")
        self.etc_dir = self._write_minimal_etc()

    def _write_minimal_etc(self) -> Path:
        etc = self.root / "etc-minimal"
        etc.mkdir(exist_ok=True)
        os.chmod(etc, 0o755)
        files = {
            "passwd": "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
                      "sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/sh\n",
            "group": "root:x:0:\nsandbox:x:{uid}:\n",
            "hosts": "127.0.0.1 localhost sandbox\n",
        }
        for name, text in files.items():
            write_atomically(etc / name, text.replace("{uid}", "65534"))
        return etc

    @property
    def isolated(self) -> bool:
        return self.config.isolation == "bwrap"

    def warn_if_unisolated(self) -> None:
        if not self.isolated:
            log.warning("sandbox isolation='none': running untrusted code WITHOUT namespaces "
                        "(host filesystem and network visible); only rlimits and deadlines apply")

    def bwrap_argv(self, workspace: Path, extra_ro: Sequence[tuple[str, str]] = ()) -> list[str]:
        argv = [self.config.bwrap_path, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                "--new-session", "--hostname", "sandbox", "--clearenv"]
        for key, value in _SANDBOX_ENV.items():
            argv += ["--setenv", key, value]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/lib", "/lib64", "/sbin", "/lib32", "/libx32"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        for name in _ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for name in ("passwd", "group", "hosts"):
            argv += ["--ro-bind", str(self.etc_dir / name), f"/etc/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
        for source, dest in extra_ro:
            argv += ["--ro-bind", source, dest]
        argv += ["--bind", str(workspace), WORKSPACE_MOUNT, "--chdir", WORKSPACE_MOUNT, "--"]
        return argv

    def command(self, argv: Sequence[str], workspace: Path, extra_ro: Sequence[tuple[str, str]] = ()) -> tuple[list[str], str | None, dict | None]:
        """(full argv, cwd, env) that runs `argv` in the sandbox for `workspace`."""
        if self.isolated:
            return self.bwrap_argv(workspace, extra_ro) + list(argv), None, None
        return list(argv), str(workspace), {**_SANDBOX_ENV, "HOME": str(workspace)}

    def run(self, argv: Sequence[str], workspace: Path, uid: int | None, limits: Limits,
            stdin: bytes | None = None) -> ExecResult:
        """Run one command in a fresh sandbox over `workspace` (a "cold" start). Never raises for the program.

        Raises EnvInfraError(SANDBOX_CRASH) when bubblewrap itself fails to set the sandbox up: its
        status fd (which the program never sees) then lacks the exit-code record, so a program
        cannot fake an infra error by printing bwrap-like messages.
        """
        self.warn_if_unisolated()
        full, cwd, env = self.command(argv, workspace)
        status_r = status_w = None
        if self.isolated:
            status_r, status_w = os.pipe()
            full = [full[0], "--json-status-fd", str(status_w)] + full[1:]
        started = time.monotonic()
        try:
            proc = spawn(full, limits=limits, uid=uid, cwd=cwd, env=env,
                         stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                         pass_fds=(status_w,) if status_w is not None else ())
        finally:
            if status_w is not None:
                os.close(status_w)
        if stdin:
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
        result = capture(proc, limits, started)
        if status_r is not None:
            with os.fdopen(status_r, "rb") as f:
                status = f.read()
            if b'"exit-code"' not in status and not result.killed_by:
                raise EnvInfraError(InfraErrorClass.SANDBOX_CRASH,
                                    f"bubblewrap failed to start the sandbox: {result.stderr[-500:]}")
        if uid is not None and self.isolated:
            settle_uid(uid)  # the uid is this sandbox's alone: nothing of it may outlive the call
        return result

    def python_argv(self, code: str) -> list[str]:
        # -E: ignore PYTHON* variables; -s: no user site. Like `python3 -c`, the cwd is on sys.path.
        return [self.config.python_executable, "-E", "-s", "-c", code]
