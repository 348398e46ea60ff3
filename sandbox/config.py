"""`SandboxConfig`: how untrusted code is isolated, pooled and limited, and how remote envs are called.

One frozen dataclass for the whole package; the controller composes it into its own config.
Nothing here changes compiled shapes. `validate()` runs at construction and names the field,
the rule and the value seen.
"""

from __future__ import annotations

import dataclasses

ISOLATION_MODES = ("bwrap", "none")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Isolation, pool, resource limits, verifier and remote-call settings."""

    isolation: str = "bwrap"
    """"bwrap" (namespaces + rlimits, required unless you opt out) or "none" (rlimits only; warns on every run)."""
    bwrap_path: str = "/usr/bin/bwrap"
    """The bubblewrap binary; missing while isolation="bwrap" is an error at construction."""
    python_executable: str = "/usr/bin/python3"
    """Interpreter that runs the `python` tool inside the sandbox; must be stdlib-only readable by the sandbox uid."""
    root_dir: str = "/tmp/orrery-sandbox"
    """Directory holding every workspace (one subdirectory + lease file each); the reaper scans it."""
    pool_size: int = 2
    """Sandboxes kept ready (workspace created, warm server started) for the next lease."""
    warm: bool = True
    """Pre-start a bwrap'd fork server per sandbox so a tool call costs a fork, not an interpreter start."""
    lease_ttl_s: float = 900.0
    """Seconds a lease may be held; past it the reaper kills the sandbox and later calls raise EnvInfraError."""
    reap_interval_s: float = 30.0
    """Seconds between reaper sweeps for expired leases and workspaces leaked by dead processes."""
    uid_base: int = 200_000
    """Sandboxed processes run as host uid uid_base + slot (never root), so rlimits on processes apply."""
    cpu_s: int = 10
    """RLIMIT_CPU per tool call, in CPU seconds (SIGXCPU at the limit, SIGKILL a second later)."""
    memory_bytes: int = 1 << 30
    """RLIMIT_AS per process, in bytes of virtual address space."""
    file_size_bytes: int = 16 << 20
    """RLIMIT_FSIZE: largest file a tool call may write, in bytes."""
    max_processes: int = 64
    """RLIMIT_NPROC for the sandbox uid: caps fork bombs."""
    max_open_files: int = 256
    """RLIMIT_NOFILE per process."""
    max_output_bytes: int = 64 << 10
    """Captured stdout (and separately stderr) per call; a program writing more is killed (killed_by="output")."""
    kill_grace_s: float = 2.0
    """Extra seconds the host waits past a call's deadline before killing the whole sandbox itself."""
    verifier_timeout_s: float = 20.0
    """Deadline of one verifier call; missing it raises EnvInfraError(VERIFIER_TIMEOUT)."""
    remote_timeout_s: float = 10.0
    """Deadline of one EnvService RPC."""
    remote_retries: int = 2
    """Extra attempts after a retryable EnvService failure (unavailable, deadline exceeded)."""
    remote_backoff_s: float = 0.2
    """First retry delay in seconds; doubles each retry."""

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"SandboxConfig.isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}")
        positive = ("pool_size", "lease_ttl_s", "reap_interval_s", "cpu_s", "memory_bytes", "file_size_bytes",
                    "max_processes", "max_open_files", "max_output_bytes", "verifier_timeout_s", "remote_timeout_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("kill_grace_s", "remote_retries", "remote_backoff_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"SandboxConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.uid_base < 1000:
            raise ValueError(f"SandboxConfig.uid_base must be >= 1000 (never a system uid), got {self.uid_base}")
