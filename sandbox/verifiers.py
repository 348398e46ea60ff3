"""Verifiers: outcome and process judges that run in killable worker processes with deadlines.

A verifier is a plain module-level function (importable as "module:function") that takes JSON-
or pickle-able arguments and returns a value. `call()` runs it in a worker subprocess
(`python -m sandbox.verifiers`, preloading math_verify) and waits at most `timeout_s`:

- the worker misses the deadline  -> it is killed, EnvInfraError(VERIFIER_TIMEOUT)
- it dies, or the function raises -> EnvInfraError(VERIFIER_CRASH) with the traceback

never a reward: a verifier failure is the infrastructure's fault (DESIGN.md rule 3). Workers are
reused between calls and replaced after a kill. Built in: `math_equal` (math-verify parse and
verify, with its own signal-based timeouts off, since our deadline is the one that counts),
`exact_match`, `regex_match` (a catastrophic pattern is exactly what the deadline is for), and
`run_function_tests` for code, which executes the candidate in a fresh cold sandbox (never the
agent's own warm one, which the agent could have tampered with) and compares the returned values
on the host, so expected outputs never enter the sandbox.

Reward model: `reward_model_score` is the interface only (a scorer named "module:function"
run in the worker). The learned scalar-head model from `model/` is NOT wired in yet.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from sandbox.api import EnvInfraError, InfraErrorClass

PRELOAD = ("math_verify",)
STARTUP_TIMEOUT_S = 60.0
MAX_WORKERS = 4


def _function_path(fn: Callable | str) -> str:
    if isinstance(fn, str):
        return fn
    if "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        raise ValueError(f"verifier {fn!r} must be a module-level function importable by name")
    return f"{fn.__module__}:{fn.__qualname__}"


def _write(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _read(stream) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError
    size = struct.unpack(">I", header)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class _Worker:
    def __init__(self):
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "sandbox.verifiers"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=root)
        self.ready = False

    def _reply(self, timeout_s: float) -> Any:
        """The next message, None on timeout; EOFError if the worker died."""
        import select
        if not select.select([self.proc.stdout], [], [], max(timeout_s, 0.0))[0]:
            return None
        return _read(self.proc.stdout)

    def call(self, path: str, args: tuple, timeout_s: float) -> Any:
        if not self.ready:
            if self._reply(STARTUP_TIMEOUT_S) != "ready":
                raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH, "verifier worker failed to start")
            self.ready = True
        _write(self.proc.stdin, (path, args))
        reply = self._reply(timeout_s)
        if reply is None:
            raise EnvInfraError(InfraErrorClass.VERIFIER_TIMEOUT, f"{path} missed its {timeout_s:g}s deadline")
        status, value = reply
        if status != "ok":
            raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH, f"{path} raised: {value}")
        return value

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


_idle: list[_Worker] = []
_lock = threading.Lock()


def call(fn: Callable | str, *args: Any, timeout_s: float) -> Any:
    """Run `fn(*args)` in a worker process; its return value, or EnvInfraError on timeout/crash."""
    path = _function_path(fn)
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
    try:
        value = worker.call(path, args, timeout_s)
    except EnvInfraError:
        worker.kill()  # never reuse a worker that hung, died or raised
        raise
    except (EOFError, BrokenPipeError, OSError, pickle.UnpicklingError) as error:
        worker.kill()
        raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH, f"{path}: worker died ({error!r})") from None
    with _lock:
        if len(_idle) < MAX_WORKERS:
            _idle.append(worker)
            worker = None
    if worker is not None:
        worker.kill()
    return value


def prewarm(n: int = 1) -> None:
    """Start `n` workers now, so the first verification does not pay the interpreter start."""
    workers = [_Worker() for _ in range(n)]
    for w in workers:
        if w._reply(STARTUP_TIMEOUT_S) == "ready":
            w.ready = True
    with _lock:
        _idle.extend(workers)


def shutdown() -> None:
    with _lock:
        workers, _idle[:] = list(_idle), []
    for w in workers:
        w.kill()


# ---------------------------------------------------------------------------------------------
# verifier functions: these run inside the worker


def math_equal_in_worker(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    gold_parsed = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=None)
    answer_parsed = parse(answer, parsing_timeout=None)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))


def regex_match_in_worker(pattern: str, answer: str) -> bool:
    return re.fullmatch(pattern, answer.strip()) is not None


def math_equal(gold: str, answer: str | None, timeout_s: float) -> bool:
    """math-verify's judgement that `answer` equals `gold` (LaTeX or plain expressions)."""
    if answer is None or not answer.strip():
        return False
    return call(math_equal_in_worker, gold, answer, timeout_s=timeout_s)


def exact_match(expected: str, answer: str | None) -> bool:
    """Equal after trimming whitespace (cheap and total: runs in-process)."""
    return answer is not None and answer.strip() == expected.strip()


def regex_match(pattern: str, answer: str | None, timeout_s: float) -> bool:
    """`pattern` matches the whole trimmed answer (in a worker: patterns can backtrack forever)."""
    return answer is not None and call(regex_match_in_worker, pattern, answer, timeout_s=timeout_s)


def reward_model_score(scorer: str, prompt: str, transcript: str, timeout_s: float) -> float:
    """Interface for a learned reward model: `scorer` ("module:function") returns a float. Stub: no model wired."""
    return float(call(scorer, prompt, transcript, timeout_s=timeout_s))


# ---------------------------------------------------------------------------------------------
# code: unit tests in a fresh sandbox, compared on the host

CASE_TIMEOUT_S = 1.0  # per test case; the first case over it fails itself and every case after it

_HARNESS = r'''
import json, signal, sys
cases = json.loads(sys.stdin.read())
results = []
def _timeout(signum, frame):
    raise TimeoutError("case timed out")
signal.signal(signal.SIGALRM, _timeout)
try:
    import solution
    fn = getattr(solution, FUNCTION)
except BaseException as e:
    print(json.dumps({"import_error": repr(e)[:500]}))
    sys.exit(0)
for args in cases:
    try:
        signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT)
        value = fn(*args)
        signal.setitimer(signal.ITIMER_REAL, 0)
        json.dumps(value)
        results.append({"value": value})
    except TimeoutError:
        break
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        results.append({"error": repr(e)[:200]})
print(json.dumps({"results": results}))
'''


def run_function_tests(pool, source: str, function: str, cases: list[dict], wall_s: float) -> list[bool]:
    """Pass/fail per case ({"args": [...], "expected": ...}) of `function` from `source`.

    Runs in a fresh one-shot sandbox from `pool`; only the inputs go in, the comparison with the
    expected values happens here. A solution that hangs (past CASE_TIMEOUT_S on a case, or the
    whole run past `wall_s`), crashes or prints garbage fails its cases (the agent's fault); a
    sandbox that cannot run at all raises EnvInfraError.
    """
    if not cases:
        return []
    sandbox = pool.acquire(warm=False)
    try:
        (sandbox.workspace / "solution.py").write_text(source)
        harness = _HARNESS.replace("FUNCTION", repr(function)).replace("CASE_TIMEOUT", repr(CASE_TIMEOUT_S))
        stdin = json.dumps([c["args"] for c in cases])
        ran = sandbox.run(sandbox.pool.isolator.python_argv(harness), wall_s, stdin=stdin)
    finally:
        sandbox.release()
    try:
        report = json.loads(ran.stdout.strip().splitlines()[-1]) if ran.stdout.strip() else {}
    except (ValueError, IndexError):
        report = {}
    results = report.get("results") if isinstance(report, dict) else None
    if not isinstance(results, list) or len(results) > len(cases):
        return [False] * len(cases)
    results = results + [{}] * (len(cases) - len(results))  # cases after a timeout fail
    # Compare through JSON so tuples/lists and int/float spellings agree with the expected values.
    return [isinstance(r, dict) and "value" in r and r["value"] == json.loads(json.dumps(c["expected"]))
            for r, c in zip(results, cases)]


# ---------------------------------------------------------------------------------------------
# the worker process


def _serve() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _write(stdout, "ready")
    while True:
        try:
            path, args = _read(stdin)
        except EOFError:
            return
        try:
            module, _, qualname = path.partition(":")
            fn = importlib.import_module(module)
            for part in qualname.split("."):
                fn = getattr(fn, part)
            _write(stdout, ("ok", fn(*args)))
        except BaseException:
            _write(stdout, ("error", traceback.format_exc(limit=5)[-2000:]))


if __name__ == "__main__":
    _serve()
