"""The pool, the weaker mode, side effects and safety rules: the sandbox's bookkeeping.

Proves: leases get fresh private workspaces with lease files and are deleted on release; a lease
past its TTL is killed and its next call raises EnvInfraError; the reaper deletes directories of
dead holders and keeps live ones; a missing bwrap is refused at construction unless
isolation="none" is chosen, which then warns on every run; snapshots diff into created /
modified / deleted with sizes and sha256 and never follow symlinks; the safety rules flag
network, outside-workspace and protected-path evidence and nothing else.

Run: .venv/bin/python -m pytest tests/sandbox/test_pool.py -q
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import time
import uuid

import pytest

from sandbox import safety, sideeffects
from sandbox.api import (EnvInfraError, FileChange, FileChangeKind, InfraErrorClass, SafetyPolicy, ToolCall,
                         ToolResult)
from sandbox.config import SandboxConfig
from sandbox.isolation import Isolator, Limits, SandboxUnavailableError
from sandbox.pool import SandboxPool, reap_orphans


def test_leases_are_private_and_cleaned_up(pool):
    a, b = pool.acquire(), pool.acquire()
    assert a.workspace != b.workspace and a.uid != b.uid
    lease = json.loads((a.dir / "lease.json").read_text())
    assert lease["pid"] == os.getpid() and lease["expiry"] > time.time()
    a.run_shell("echo private > mine", 5)
    assert "No such file" in b.run_shell("cat mine", 5).stderr
    a.release(wait=True)
    a.release()  # twice is fine
    assert not a.dir.exists()
    with pytest.raises(EnvInfraError):
        a.run_shell("true", 5)
    b.release()


def test_expired_lease_is_killed_and_raises(pool):
    sandbox = pool.acquire(ttl_s=0.2)
    sandbox.run_shell("true", 5)
    deadline = time.monotonic() + 10
    # The reaper marks the lease expired, then removes its directory in the background.
    while not (sandbox.expired and not sandbox.dir.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox.expired and not sandbox.dir.exists()
    with pytest.raises(EnvInfraError) as caught:
        sandbox.run_shell("true", 5)
    assert caught.value.error_class is InfraErrorClass.SANDBOX_CRASH
    sandbox.release()


def test_reaper_removes_leaked_sandboxes_of_dead_holders(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name, pid, start in [("leaked", dead.pid, "1"), ("live", os.getpid(), None)]:
        (tmp_path / name / "workspace").mkdir(parents=True)
        if start is None:
            with open(f"/proc/{pid}/stat") as f:
                start = f.read().rsplit(")", 1)[1].split()[19]
        (tmp_path / name / "lease.json").write_text(json.dumps({"pid": pid, "pid_start": start, "expiry": 0}))
    assert reap_orphans(tmp_path) == ["leaked"]
    assert (tmp_path / "live").exists() and not (tmp_path / "leaked").exists()


def test_missing_bwrap_is_refused(tmp_path):
    with pytest.raises(SandboxUnavailableError, match="bwrap_path"):
        Isolator(SandboxConfig(bwrap_path="/nonexistent/bwrap", root_dir=f"/tmp/orrery-test-{uuid.uuid4().hex[:8]}"))


def test_isolation_none_runs_but_warns_every_time(caplog):
    root = f"/tmp/orrery-test-{uuid.uuid4().hex[:8]}"
    config = SandboxConfig(isolation="none", bwrap_path="/nonexistent/bwrap", root_dir=root)
    pool = SandboxPool(config)
    try:
        sandbox = pool.acquire()
        with caplog.at_level(logging.WARNING, logger="sandbox.isolation"):
            first = sandbox.run_shell("echo hi", 5)
            second = sandbox.run_python("print(1)", 5)
        assert first.stdout == "hi\n" and second.stdout == "1\n"
        assert sum("WITHOUT namespaces" in r.message for r in caplog.records) == 2
        loop = sandbox.run_shell("sleep 30", 0.5)
        assert loop.killed_by == "wall_clock"
        sandbox.release()
    finally:
        pool.close()
        subprocess.run(["rm", "-rf", root])


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="SandboxConfig.isolation"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="SandboxConfig.pool_size"):
        SandboxConfig(pool_size=0)


def test_limits_come_from_the_config():
    config = SandboxConfig(cpu_s=3)
    assert Limits.from_config(config, 7.0).cpu_s == 3 and Limits.from_config(config, 7.0).wall_s == 7.0


def test_snapshot_diff(tmp_path):
    (tmp_path / "keep").write_text("same")
    (tmp_path / "change").write_text("before")
    (tmp_path / "gone").write_text("bye")
    before = sideeffects.snapshot(tmp_path)
    (tmp_path / "change").write_text("after!")
    (tmp_path / "gone").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new").write_text("new")
    os.symlink("/etc/hostname", tmp_path / "link")
    changes = sideeffects.diff(before, sideeffects.snapshot(tmp_path, before))
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    assert changes == (
        FileChange("change", FileChangeKind.MODIFIED, 6, sha(b"after!")),
        FileChange("gone", FileChangeKind.DELETED),
        FileChange("link", FileChangeKind.CREATED, len("/etc/hostname"), sha(b"symlink:/etc/hostname")),
        FileChange("sub/new", FileChangeKind.CREATED, 3, sha(b"new")),
    )


def test_safety_rules():
    policy = SafetyPolicy(protected_paths=("keep.txt",))
    ok = safety.check_step(policy, ToolCall("shell", {"command": "ls -la"}), ToolResult(), ())
    assert ok == ()
    net = safety.check_step(policy, ToolCall("shell", {"command": "curl http://x"}), ToolResult(), ())
    assert [v.kind for v in net] == ["network"]
    unreachable = safety.check_step(policy, ToolCall("python", {"code": "..."}),
                                    ToolResult(error="OSError: [Errno 101] Network is unreachable"), ())
    assert [v.kind for v in unreachable] == ["network"]
    host = safety.check_step(policy, ToolCall("shell", {"command": "cat /root/.ssh/id_rsa"}), ToolResult(), ())
    assert [v.kind for v in host] == ["outside_workspace"]
    refused = safety.check_step(policy, ToolCall("read_file", {"path": "/etc/passwd"}), ToolResult(), (), True)
    assert [v.kind for v in refused] == ["outside_workspace"]
    deleted = safety.check_step(policy, ToolCall("shell", {"command": "rm keep.txt"}), ToolResult(),
                                (FileChange("keep.txt", FileChangeKind.DELETED),))
    assert [v.kind for v in deleted] == ["protected_path"]
    off = safety.check_step(SafetyPolicy(forbid_network=False), ToolCall("shell", {"command": "curl x"}),
                            ToolResult(), ())
    assert off == ()


def test_bwrap_setup_failure_is_infra_and_cannot_be_faked(pool, cold):
    faked = cold.run_shell("echo 'bwrap: Can'\"'\"'t find source path /x' >&2; exit 1", 5)
    assert faked.exit_status == 1  # the agent's own output: a result, not an infra error
    broken = Isolator(pool.config)
    broken.bwrap_argv = lambda workspace, extra_ro=(): [pool.config.bwrap_path, "--ro-bind", "/nonexistent", "/x",
                                                        "--"]
    with pytest.raises(EnvInfraError) as caught:
        broken.run(["/bin/true"], cold.workspace, cold.uid, cold.limits(5))
    assert caught.value.error_class is InfraErrorClass.SANDBOX_CRASH
