"""Built-in environments and their registry: `KINDS`, `make_env`, `generate_tasks`.

    calc   arithmetic with a calculator tool; the demo env (sandbox/envs/calc.py)
    code   write a Python function; reward from visible tests, true metric from hidden ones (code.py)
    files  a multi-step workspace task with a process verifier and a trap file (files.py)

`make_env` builds one episode of a built-in kind; `sandbox.client.open_env` is the entry point
that also handles kind "remote". `generate_tasks` returns the spec's explicit tasks if it has
any, otherwise the kind's own, deterministically from `spec.args` (for "remote": the server's).
"""

from __future__ import annotations

from sandbox.api import Env, EnvSpec, Task
from sandbox.config import SandboxConfig
from sandbox.envs import calc, code, files

KINDS = {
    "calc": (calc.CalcEnv, calc.generate_tasks),
    "code": (code.CodeEnv, code.generate_tasks),
    "files": (files.FilesEnv, files.generate_tasks),
}


def _kind(spec: EnvSpec):
    if spec.kind not in KINDS:
        raise ValueError(f"EnvSpec.kind: must be one of {sorted(KINDS)} for a built-in env, got {spec.kind!r}")
    return KINDS[spec.kind]


def make_env(spec: EnvSpec, task: Task, config: SandboxConfig | None = None, pool=None) -> Env:
    """One episode of `task` in the built-in env `spec.kind`. Call reset() first and close() at the end."""
    env_class, _ = _kind(spec)
    return env_class(spec, task, config or SandboxConfig(), pool=pool)


def generate_tasks(spec: EnvSpec, config: SandboxConfig | None = None) -> list[Task]:
    """The env's tasks: `spec.tasks` if given, else generated from `spec.args` (deterministic)."""
    if spec.tasks:
        return list(spec.tasks)
    if spec.kind == "remote":
        from sandbox.client import list_tasks  # deferred: gRPC only for remote envs

        return list_tasks(spec, config or SandboxConfig())
    _, generate = _kind(spec)
    return generate(spec)
