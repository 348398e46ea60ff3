"""A pool of sandboxes: ready workspaces (with a warm server each), leases with a time to live, a reaper.

Layout on disk, one directory per sandbox under `SandboxConfig.root_dir`:

    <root>/<sandbox id>/lease.json   {"pid", "pid_start", "expiry", "uid"} of the holding process
    <root>/<sandbox id>/workspace/   bound at /workspace inside; owned by the sandbox uid
    <root>/<sandbox id>/server.log   the warm server's stderr

`acquire()` hands out a ready sandbox (or makes one) and the maintenance thread refills the pool
in the background, so a lease costs a list pop. `release()` kills the sandbox's processes at
once and leaves reaping them and deleting the directory to the maintenance thread. A lease older than its TTL is expired by the maintenance thread: its
processes are killed and its directory removed; the holder's next call raises EnvInfraError.
The reaper also removes directories whose holder process is gone (a crashed worker): its
sandboxes died with it (parent-death signal), only the files were left.

Each sandbox runs as its own host uid (`uid_base` + a per-process offset + slot), so per-uid
limits are per sandbox. Without root the uid cannot change and all sandboxes run as the caller.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from sandbox.api import EnvInfraError, InfraErrorClass
from sandbox.config import SandboxConfig
from sandbox.isolation import ExecResult, Isolator, Limits, write_atomically
from sandbox.warm import WarmServer

log = logging.getLogger(__name__)

_UIDS_PER_PROCESS = 256


def _process_start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat: tells a live holder from a reused pid. "" if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return ""


class Sandbox:
    """One leased workspace. `run_python` / `run_shell` / `run` execute inside it; never raise for the program."""

    def __init__(self, pool: "SandboxPool", sandbox_id: str, uid: int | None, warm: bool):
        self.pool = pool
        self.id = sandbox_id
        self.uid = uid
        self.dir = pool.root / sandbox_id
        self.workspace = self.dir / "workspace"
        self.expiry = float("inf")
        self.expired = False
        self.released = False
        self._lock = threading.Lock()
        self.dir.mkdir(mode=0o711)
        self.workspace.mkdir(mode=0o700)
        if uid is not None:
            os.chown(self.workspace, uid, uid)
        self._write_lease(pool.config.lease_ttl_s)  # marks the directory as ours for other reapers
        self._server = WarmServer(pool.isolator, self.workspace, uid, self.dir / "server.log") if warm else None
        if self._server is not None:
            self._server.start()

    def _write_lease(self, ttl_s: float) -> None:
        self.expiry = time.time() + ttl_s
        lease = {"pid": os.getpid(), "pid_start": _process_start_time(os.getpid()), "expiry": self.expiry,
                 "uid": self.uid}
        tmp = self.dir / "lease.json.tmp"
        tmp.write_text(json.dumps(lease))
        tmp.replace(self.dir / "lease.json")

    def limits(self, wall_s: float) -> Limits:
        return Limits.from_config(self.pool.config, wall_s)

    def run(self, argv: list[str], wall_s: float, stdin: str = "") -> ExecResult:
        with self._lock:
            self._check_usable()
            limits = self.limits(wall_s)
            if self._server is not None:
                return self._server.call({"argv": argv, "stdin": stdin}, limits)
            return self.pool.isolator.run(argv, self.workspace, self.uid, limits, stdin.encode() or None)

    def run_python(self, code: str, wall_s: float, stdin: str = "") -> ExecResult:
        with self._lock:
            self._check_usable()
            limits = self.limits(wall_s)
            if self._server is not None:
                return self._server.call({"code": code, "stdin": stdin}, limits)
            argv = self.pool.isolator.python_argv(code)
            return self.pool.isolator.run(argv, self.workspace, self.uid, limits, stdin.encode() or None)

    def run_shell(self, command: str, wall_s: float) -> ExecResult:
        return self.run(["/bin/sh", "-c", command], wall_s)

    def _check_usable(self) -> None:
        if self.expired:
            raise EnvInfraError(InfraErrorClass.SANDBOX_CRASH, f"sandbox {self.id}: lease expired (ttl passed)")
        if self.released:
            raise EnvInfraError(InfraErrorClass.SANDBOX_CRASH, f"sandbox {self.id}: used after release")

    def destroy(self) -> None:
        if self._server is not None:
            self._server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def release(self, wait: bool = False) -> None:
        """Kill its processes; delete its files now (wait=True) or in the background. Safe to call twice."""
        self.pool.release(self, wait)


class SandboxPool:
    """Warm sandboxes for leases. One per process and config is enough: see `get_pool`."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.isolator = Isolator(config)  # refuses here when bwrap is required but missing
        self.root = self.isolator.root
        self.warm = config.warm and self.isolator.isolated
        write_atomically(self.root / "forkserver.py", (Path(__file__).parent / "forkserver.py").read_text())
        can_switch_uid = os.geteuid() == 0
        offset = config.uid_base + (os.getpid() % 1000) * _UIDS_PER_PROCESS
        self._uids = itertools.cycle(range(offset, offset + _UIDS_PER_PROCESS)) if can_switch_uid else None
        self._ready: list[Sandbox] = []
        self._leased: dict[str, Sandbox] = {}
        self._to_destroy: list[Sandbox] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        reap_orphans(self.root)
        self._thread = threading.Thread(target=self._maintain, name="sandbox-pool", daemon=True)
        self._thread.start()
        self._wake.set()

    def _new(self, warm: bool) -> Sandbox:
        uid = next(self._uids) if self._uids is not None else None
        return Sandbox(self, uuid.uuid4().hex[:12], uid, warm)

    def acquire(self, ttl_s: float | None = None, warm: bool | None = None) -> Sandbox:
        """Lease a fresh sandbox for `ttl_s` seconds (default `lease_ttl_s`). warm=False: one-shot runs, no server."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        warm = self.warm if warm is None else (warm and self.isolator.isolated)
        sandbox = None
        if warm:
            with self._lock:
                sandbox = self._ready.pop() if self._ready else None
            self._wake.set()
        if sandbox is None:
            sandbox = self._new(warm)
        sandbox._write_lease(self.config.lease_ttl_s if ttl_s is None else ttl_s)
        with self._lock:
            self._leased[sandbox.id] = sandbox
        return sandbox

    def release(self, sandbox: Sandbox, wait: bool = False) -> None:
        """Kill the sandbox's processes now; reap them and delete its files now (wait) or in the background."""
        with self._lock:
            if sandbox.released:
                return
            sandbox.released = True
            self._leased.pop(sandbox.id, None)
            if not wait:
                self._to_destroy.append(sandbox)
        if wait:
            sandbox.destroy()
            return
        if sandbox._server is not None:
            sandbox._server.kill()
        self._wake.set()

    def _maintain(self) -> None:
        while not self._closed:
            self._wake.wait(timeout=min(self.config.reap_interval_s, 1.0))
            self._wake.clear()
            if self._closed:
                return
            with self._lock:
                doomed, self._to_destroy = self._to_destroy, []
            for sandbox in doomed:
                sandbox.destroy()
            self.expire_leases()
            while self.warm and not self._closed:
                with self._lock:
                    if len(self._ready) >= self.config.pool_size:
                        break
                try:
                    sandbox = self._new(warm=True)
                except OSError:
                    log.exception("could not create a pooled sandbox")
                    break
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._ready.append(sandbox)
                if closed:  # close() already drained the lists: this one is ours to remove
                    sandbox.released = True
                    sandbox.destroy()
                    return

    def expire_leases(self) -> None:
        now = time.time()
        with self._lock:
            expired = [s for s in self._leased.values() if s.expiry < now]
            for s in expired:
                s.expired = True
                self._leased.pop(s.id)
        for s in expired:
            log.warning("sandbox %s: lease expired, killing it", s.id)
            with s._lock:  # waits for a call in progress to end (calls have their own deadline)
                s.destroy()

    def stats(self) -> dict:
        with self._lock:
            return {"sandbox/ready": len(self._ready), "sandbox/leased": len(self._leased)}

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        with self._lock:
            sandboxes = self._ready + list(self._leased.values()) + self._to_destroy
            self._ready, self._leased, self._to_destroy = [], {}, []
        for s in sandboxes:
            s.released = True
            s.destroy()


def reap_orphans(root: Path) -> list[str]:
    """Delete sandbox directories whose holder process is gone (crashed). Returns the removed ids."""
    removed = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        lease_file = entry / "lease.json"
        if not entry.is_dir() or entry.name == "etc-minimal":
            continue
        try:
            lease = json.loads(lease_file.read_text())
            alive = _process_start_time(int(lease["pid"])) == lease["pid_start"] != ""
        except (FileNotFoundError, ValueError, KeyError):
            # No lease file yet: being created right now, or litter from a crash mid-creation.
            try:
                alive = time.time() - entry.stat().st_mtime < 60
            except FileNotFoundError:
                continue
        if not alive:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    if removed:
        log.info("reaped %d leaked sandbox directories under %s", len(removed), root)
    return removed


_POOLS: dict[SandboxConfig, SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(config: SandboxConfig) -> SandboxPool:
    """The process-wide pool for `config` (created on first use)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(config)
        if pool is None:
            pool = _POOLS[config] = SandboxPool(config)
        return pool
