"""Shared fixtures for the sandbox tests: a small-limit pool on a temporary root, and host probes.

Tests that need bubblewrap use the `pool` / `warm` / `cold` / `any_sandbox` fixtures, which skip
(with the reason) when /usr/bin/bwrap is absent or cannot create namespaces on this host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from sandbox.config import SandboxConfig

BWRAP = "/usr/bin/bwrap"


def _bwrap_usable() -> str:
    """"" when bubblewrap works here, else the reason it does not."""
    if not os.access(BWRAP, os.X_OK):
        return f"{BWRAP} is not installed (Debian: apt-get install bubblewrap)"
    probe = subprocess.run([BWRAP, "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr", "--symlink",
                            "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                            "--proc", "/proc", "--dev", "/dev", "/bin/true"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"bwrap cannot create namespaces here: {probe.stderr.strip()}"


BWRAP_REASON = _bwrap_usable()


def small_config(root: str, **overrides) -> SandboxConfig:
    """Tight limits so adversarial programs hit them quickly on a shared 2-core machine."""
    fields = dict(root_dir=root, pool_size=1, cpu_s=2, memory_bytes=512 << 20, file_size_bytes=1 << 20,
                  max_processes=48, max_open_files=64, max_output_bytes=16 << 10, kill_grace_s=2.0,
                  verifier_timeout_s=10.0, lease_ttl_s=120.0)
    fields.update(overrides)
    return SandboxConfig(**fields)


@pytest.fixture(scope="session")
def small_config_factory():
    return small_config


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    if BWRAP_REASON:
        pytest.skip(BWRAP_REASON)
    from sandbox.pool import SandboxPool

    root = f"/tmp/orrery-test-{uuid.uuid4().hex[:8]}"  # pytest's tmp dirs are 0700: no use to other uids
    pool = SandboxPool(small_config(root))
    yield pool
    pool.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def warm(pool):
    sandbox = pool.acquire()
    yield sandbox
    sandbox.release()


@pytest.fixture
def cold(pool):
    sandbox = pool.acquire(warm=False)
    yield sandbox
    sandbox.release()


@pytest.fixture(params=["warm", "cold"])
def any_sandbox(request, pool):
    sandbox = pool.acquire(warm=request.param == "warm")
    yield sandbox
    sandbox.release()
