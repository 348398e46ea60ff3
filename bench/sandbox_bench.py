"""Tool-call latency and throughput: warm pool vs cold bubblewrap vs a plain subprocess, in one run.

    .venv/bin/python bench/sandbox_bench.py [--calls 40] [--threads 2]

For two tool payloads (a Python program, a shell command) it measures, in the same process and
run, one after another:
- plain:  subprocess.run of the same command, no isolation at all (the baseline)
- cold:   a one-shot bwrap sandbox per call (namespaces, rlimits, uid drop; an existing workspace)
- lease:  the whole life of a one-call episode: lease a warm sandbox, one call, release it
- warm:   calls on an already leased warm sandbox (a fork inside the running sandbox)
and prints the median and p90 latency, the sequential throughput and the throughput with
`--threads` concurrent episodes, each as a ratio against the plain baseline (< 1 is faster).
The in-process calculator is listed for scale. Needs bubblewrap; isolation costs are the point.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402
from sandbox.tools import calculate  # noqa: E402

PROGRAM = "import json\nprint(json.dumps({'sum': sum(range(1000))}))"
COMMAND = "ls -la . > /dev/null && echo done"


def timed(fn, calls: int) -> list[float]:
    fn()  # warm-up: page cache, imports, the first server start
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def throughput(make_fn, calls: int, threads: int) -> float:
    """Calls per second with `threads` workers, each with its own callable."""
    fns = [make_fn() for _ in range(threads)]
    per_thread = max(1, calls // threads)
    started = time.perf_counter()
    workers = [threading.Thread(target=lambda f=f: [f() for _ in range(per_thread)]) for f in fns]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return per_thread * threads / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    root = f"/tmp/orrery-bench-{os.getpid()}"
    config = SandboxConfig(root_dir=root, pool_size=max(2, args.threads))
    pool = SandboxPool(config)
    python = config.python_executable
    scratch = Path(tempfile.mkdtemp())
    cold = pool.acquire(warm=False)
    warm = pool.acquire()
    time.sleep(1.0)  # let the pool refill its ready sandboxes

    def plain(argv):
        return lambda: subprocess.run(argv, cwd=scratch, capture_output=True, timeout=30)

    def leased(payload_kind, payload):
        def run():
            sandbox = pool.acquire()
            try:
                (sandbox.run_python if payload_kind == "python" else sandbox.run_shell)(payload, 30)
            finally:
                sandbox.release()
        return run

    cases = {
        "python": {
            "plain": lambda: plain([python, "-E", "-s", "-c", PROGRAM]),
            "cold": lambda: (lambda: cold.run_python(PROGRAM, 30)),
            "lease": lambda: leased("python", PROGRAM),
            "warm": lambda: (lambda s=pool.acquire(): s.run_python(PROGRAM, 30)),
        },
        "shell": {
            "plain": lambda: plain(["/bin/sh", "-c", COMMAND]),
            "cold": lambda: (lambda: cold.run_shell(COMMAND, 30)),
            "lease": lambda: leased("shell", COMMAND),
            "warm": lambda: (lambda s=pool.acquire(): s.run_shell(COMMAND, 30)),
        },
    }
    print(f"sandbox bench: {args.calls} calls per row, {args.threads} threads for throughput, "
          f"{os.cpu_count()} CPUs; ratios are against 'plain' measured in this run")
    print(f"{'payload':8} {'mode':6} {'p50 ms':>8} {'p90 ms':>8} {'p50 x':>7} {'calls/s':>8} {'x':>6} "
          f"{'calls/s@' + str(args.threads):>11} {'x':>6}")
    try:
        for payload, modes in cases.items():
            base = None
            for mode, make in modes.items():
                if mode == "warm":
                    check = warm.run_python(PROGRAM, 30) if payload == "python" else warm.run_shell(COMMAND, 30)
                    assert check.exit_status == 0, check
                lat = timed(make(), args.calls)
                p50, p90 = statistics.median(lat), statistics.quantiles(lat, n=10)[-1]
                seq = len(lat) / sum(lat)
                par = throughput(make, args.calls, args.threads)
                if base is None:
                    base = (p50, seq, par)
                print(f"{payload:8} {mode:6} {p50 * 1e3:8.2f} {p90 * 1e3:8.2f} {p50 / base[0]:7.2f} {seq:8.1f} "
                      f"{seq / base[1]:6.2f} {par:11.1f} {par / base[2]:6.2f}")
        lat = timed(lambda: calculate("(12 + 34) * 56"), 1000)
        print(f"{'calc':8} {'inproc':6} {statistics.median(lat) * 1e3:8.4f}   (calculator, no sandbox)")
    finally:
        pool.close()
        subprocess.run(["rm", "-rf", root, str(scratch)])


if __name__ == "__main__":
    main()
