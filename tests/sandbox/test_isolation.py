"""The adversarial battery: one hostile program per test, each contained, reported, host healthy after.

Every test runs the program in a warm sandbox (fork server) and, where the mechanics differ, in a
cold one (a fresh bwrap per call). "Contained" means the call returns within its deadline with
a result record saying what happened (killed_by, timed_out, exit status), no process of the
sandbox's uid survives beyond the warm server itself, and the same sandbox runs the next call.

Run: .venv/bin/python -m pytest tests/sandbox/test_isolation.py -q   (skips without bubblewrap)
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from sandbox.isolation import live_pids_of_uid



def host_pids_of_uid(uid: int) -> set[int]:
    """Live (non-zombie) host processes of `uid`; a sandbox's uid is its own."""
    return set(live_pids_of_uid(uid))


def baseline_of(sandbox) -> set[int]:
    """The sandbox's processes at rest (for a warm one: bwrap, its init and the ready server)."""
    sandbox.run_python("pass", 10)
    return host_pids_of_uid(sandbox.uid)


def assert_healthy(sandbox, baseline: set[int]) -> None:
    """No leftover process of the sandbox uid, and the sandbox still answers."""
    time.sleep(0.05)
    assert host_pids_of_uid(sandbox.uid) <= baseline, "a sandboxed process outlived its call"
    after = sandbox.run_python("print('still alive')", 5)
    assert after.stdout == "still alive\n" and after.exit_status == 0


def test_fork_bomb_is_capped_by_the_process_limit(any_sandbox):
    baseline = baseline_of(any_sandbox)
    started = time.monotonic()
    r = any_sandbox.run_python("import os\nwhile True:\n    os.fork()", 5)
    assert time.monotonic() - started < 5 + 3
    assert r.exit_status != 0
    if r.killed_by == "output":
        # Refused forks print a traceback each; those can fill the output cap before the wall
        # clock ends the bomb. Then the refusals themselves must show the process limit at work.
        assert "BlockingIOError" in r.stderr or "Resource temporarily unavailable" in r.stderr, r.stderr[-500:]
    else:
        assert r.killed_by in ("processes", "wall_clock")
    assert_healthy(any_sandbox, baseline)


def test_shell_fork_bomb_is_contained(warm):
    baseline = baseline_of(warm)
    r = warm.run_shell("bomb() { bomb | bomb & }; bomb; sleep 1", 3)
    assert r.wall_s < 3 + 3
    assert_healthy(warm, baseline)


def test_memory_hog_hits_the_address_space_limit(any_sandbox):
    baseline = baseline_of(any_sandbox)
    r = any_sandbox.run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))", 10)
    assert r.killed_by == "memory" and r.exit_status != 0
    assert "MemoryError" in r.stderr
    assert_healthy(any_sandbox, baseline)


def test_infinite_loop_is_killed_at_the_wall_clock(any_sandbox):
    baseline = baseline_of(any_sandbox)
    r = any_sandbox.run_shell("while :; do sleep 0.01; done", 1)
    assert r.timed_out and r.killed_by == "wall_clock"
    assert 1 <= r.wall_s < 1 + 2
    assert_healthy(any_sandbox, baseline)


def test_busy_loop_is_killed_by_the_cpu_limit(warm):
    r = warm.run_python("while True:\n    pass", 10)  # cpu_s=2 in the test config
    assert r.killed_by == "cpu" and not r.timed_out
    assert r.cpu_s >= 1.5 and r.wall_s < 10


def test_huge_output_is_truncated_and_the_writer_killed(any_sandbox):
    baseline = baseline_of(any_sandbox)
    r = any_sandbox.run_python("while True:\n    print('x' * 1000)", 5)
    assert r.killed_by == "output" and r.output_truncated
    assert len(r.stdout.encode()) == any_sandbox.pool.config.max_output_bytes
    assert_healthy(any_sandbox, baseline)


def test_big_file_hits_the_file_size_limit(warm):
    r = warm.run_python("open('big', 'wb').write(b'x' * (4 << 20))", 5)  # file_size_bytes = 1 MiB
    assert r.killed_by == "file_size" and r.exit_status != 0
    assert (warm.workspace / "big").stat().st_size <= 1 << 20


def test_network_connect_fails(any_sandbox):
    code = ("import socket\n"
            "for host in ('1.1.1.1', '127.0.0.1'):\n"
            "    try:\n"
            "        socket.create_connection((host, 80), timeout=2)\n"
            "        print('connected', host)\n"
            "    except OSError as e:\n"
            "        print('failed', host, e)\n"
            "print(sorted(i[1] for i in socket.if_nameindex()))\n")
    r = any_sandbox.run_python(code, 10)
    assert "connected" not in r.stdout
    assert r.stdout.count("failed") == 2
    assert r.stdout.strip().endswith("['lo']")  # no interface but a downed loopback


def test_name_resolution_fails(warm):
    r = warm.run_python("import socket\nsocket.getaddrinfo('example.com', 80)", 10)
    assert r.exit_status != 0 and "gaierror" in r.stderr


def test_write_outside_the_workspace_is_refused(any_sandbox, tmp_path):
    target = f"/usr/orrery-{uuid.uuid4().hex}"
    r = any_sandbox.run_shell(f"echo pwned > {target}; echo pwned > /etc/orrery-test; echo pwned > /workspace/ok", 5)
    assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
    assert not os.path.exists(target) and not os.path.exists("/etc/orrery-test")
    assert (any_sandbox.workspace / "ok").read_text() == "pwned\n"


def test_read_outside_the_workspace_sees_nothing_of_the_host(any_sandbox):
    repo = Path(__file__).resolve().parents[2]
    r = any_sandbox.run_shell(f"ls / ; cat {repo}/sandbox/api.py; ls /home /root /work; cat /etc/shadow", 5)
    top = set(r.stdout.split())
    assert top <= {"bin", "dev", "etc", "lib", "lib64", "lib32", "libx32", "proc", "sbin", "tmp", "usr", "workspace",
                   ".orrery"}
    assert "No such file or directory" in r.stderr
    assert "Orrery" not in r.stdout


def test_host_secrets_are_invisible(any_sandbox, monkeypatch):
    token, name = uuid.uuid4().hex, uuid.uuid4().hex  # the content must not appear; the name may, in errors
    secrets = [Path(f"/root/orrery-secret-{name}"), Path(f"/etc/orrery-secret-{name}")]
    monkeypatch.setenv("ORRERY_TEST_SECRET", token)
    try:
        for path in secrets:
            path.write_text(token)
        r = any_sandbox.run_shell(f"cat {secrets[0]} {secrets[1]}; env; cat /etc/passwd; id -u", 5)
    finally:
        for path in secrets:
            path.unlink(missing_ok=True)
    assert token not in r.stdout + r.stderr
    assert "ORRERY_TEST_SECRET" not in r.stdout
    assert int(r.stdout.split()[-1]) == any_sandbox.uid != 0  # never root, inside or out


def test_killing_the_parent_is_contained(warm):
    baseline = baseline_of(warm)
    r = warm.run_python("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(30)", 5)
    assert r.killed_by == "sandbox" and r.exit_status == 137
    assert r.wall_s < 5
    after = warm.run_python("print('fresh server')", 5)  # a new server on the same workspace
    assert after.stdout == "fresh server\n"
    assert len(host_pids_of_uid(warm.uid)) <= max(len(baseline), 3)


def test_killing_init_from_inside_is_ignored(cold):
    r = cold.run_python("import os, signal\nos.kill(1, signal.SIGKILL)\nprint('survived')", 5)
    assert r.stdout == "survived\n" and r.exit_status == 0


def test_orphaned_children_do_not_outlive_the_call(any_sandbox):
    baseline = baseline_of(any_sandbox)
    code = ("import os, subprocess\n"
            "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.execv('/bin/sleep', ['sleep', '301'])\n"
            "    os._exit(0)\n"
            "print('parent exits')\n")
    r = any_sandbox.run_python(code, 5)
    assert r.stdout == "parent exits\n" and r.wall_s < 3
    assert_healthy(any_sandbox, baseline)


def test_processes_of_the_host_are_invisible(any_sandbox):
    r = any_sandbox.run_shell("ls /proc | grep -c '^[0-9]'", 5)
    assert int(r.stdout) <= 6  # init, the server, sh, ls, grep: never the host's processes


def test_workspace_persists_between_calls_of_one_lease(warm):
    warm.run_shell("echo 41 > n", 5)
    r = warm.run_python("print(int(open('n').read()) + 1)", 5)
    assert r.stdout == "42\n"
