"""Scale simulation: the single controller's own cost as the rollout fleet grows.

Setup, all real processes on this machine: M env servers (`python -m sandbox.remote_example`,
the remote "vowels" env over gRPC EnvService) and up to N_max rollout workers
(`python -m rollout.server --engine fake`: the real gRPC RolloutService, agent loop and remote-env
client, but a scripted engine with no model, so generation costs next to nothing and what is
left is the fleet's plumbing). For each N in 1, 2, 4, ... the controller side is the real
`controller.fleet.Fleet` over the first N workers (address list) and `controller.batching`
turning each step's groups into a learner `Batch`; a step is `per_worker` groups of `group_size`
per worker (the work per step grows with N, as a real fleet's would), run for `--steps` steps
after one warm-up step.

Measured in the controller process only (the workers and env servers run elsewhere):
- controller CPU per trajectory: `time.process_time()` over the step (every controller thread:
  dispatch, gRPC receive, protobuf -> dataclass, the retry/least-loaded bookkeeping, batching),
  divided by the trajectories that came back;
- controller CPU per step, and its share of the step's wall time (on a big machine this share,
  not the workers, is what saturates first);
- wall time per step and trajectories per second (bounded here by the workers sharing this
  machine's cores with each other: not a property of the controller).
Ratios are against N=1 measured in the same run (this machine is shared with other work).
A flat CPU-per-trajectory ratio means the controller's cost is linear in trajectories, not in
workers: the paper estimate in docs/operations.md ("How far one controller goes") extrapolates it.

Run: .venv/bin/python bench/scale_bench.py                      (N up to 8, M = 2; a few minutes)
     .venv/bin/python bench/scale_bench.py --max-workers 16 --env-servers 4 --steps 5
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return env


def start_env_servers(count: int, logs: pathlib.Path) -> tuple[list[subprocess.Popen], list[str]]:
    processes, addresses = [], []
    for i in range(count):
        log = open(logs / f"env-{i}.log", "w+")
        process = subprocess.Popen([sys.executable, "-m", "sandbox.remote_example", "--listen", "127.0.0.1:0"],
                                   cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        processes.append(process)
        deadline = time.monotonic() + 120
        while True:
            text = (logs / f"env-{i}.log").read_text()
            match = re.search(r"listening on port (\d+)", text)
            if match:
                addresses.append(f"127.0.0.1:{match.group(1)}")
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"env server {i} did not start:\n{text[-2000:]}")
            time.sleep(0.1)
    return processes, addresses


def start_workers(count: int, model: pathlib.Path, folder: pathlib.Path, groups: int) -> tuple[list, list[str]]:
    pending = []
    for i in range(count):
        port_file = folder / f"w{i}.port"
        process = subprocess.Popen(
            [sys.executable, "-m", "rollout.server", "--engine", "fake", "--model", str(model), "--worker-id", f"w{i}",
             "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--max-concurrent-groups", str(groups),
             "--log-level", "WARNING"],
            cwd=REPO, env=_env(), stdout=open(folder / f"w{i}.log", "w"), stderr=subprocess.STDOUT)
        pending.append((process, port_file))
    addresses = []
    for process, port_file in pending:
        deadline = time.monotonic() + 300
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rollout worker did not start; see {folder}")
            time.sleep(0.1)
        addresses.append(f"127.0.0.1:{int(port_file.read_text())}")
    return [p for p, _ in pending], addresses


def measure(n: int, worker_addresses: list[str], specs: list, tasks: dict, model: pathlib.Path,
            run_dir: pathlib.Path, args: argparse.Namespace) -> dict[str, float]:
    from controller.batching import make_minibatches
    from controller.config import FleetConfig
    from controller.fleet import Fleet
    from rollout.api import GroupRequest, SamplingParams

    fleet = Fleet(FleetConfig(addresses=tuple(worker_addresses[:n]), groups_per_worker=args.per_worker,
                              rollout_deadline_s=120, call_deadline_s=60), model, run_dir)
    fleet.start()
    rows = []
    try:
        for step in range(args.steps + 1):
            requests = []
            for i in range(n * args.per_worker):
                spec = specs[i % len(specs)]
                requests.append(GroupRequest(
                    group_id=f"n{n}-s{step}-{i}", env=spec, task=tasks[spec.name][(step * 997 + i) % len(tasks[spec.name])],
                    group_size=args.group_size,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=step * 100_003 + i)))
            wall0, cpu0 = time.perf_counter(), time.process_time()
            results = fleet.rollout(requests)
            groups = [r.trajectories for r in results if r is not None and r.trajectories]
            plans = make_minibatches(groups, "grpo", row_multiple=8, minibatches=1, skip_zero_advantage=False)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            trajectories = sum(len(g) for g in groups)
            lost = sum(sum(r.infra_errors.values()) for r in results if r is not None)
            if step == 0:
                continue  # warm-up: connections, first imports, first protobuf classes
            tokens = sum(len(t.prompt_ids) + sum(len(turn.token_ids) for turn in t.turns) for g in groups for t in g)
            rows.append({"wall": wall, "cpu": cpu, "trajectories": trajectories, "lost": lost, "tokens": tokens,
                         "rows": sum(p.batch.num_rows for p in plans)})
    finally:
        fleet.close()
    trajectories = sum(r["trajectories"] for r in rows)
    return {
        "workers": n,
        "groups_per_step": n * args.per_worker,
        "trajectories_per_step": trajectories / len(rows),
        "tokens_per_trajectory": sum(r["tokens"] for r in rows) / max(trajectories, 1),
        "step_wall_s": statistics.median(r["wall"] for r in rows),
        "step_cpu_s": statistics.median(r["cpu"] for r in rows),
        "cpu_ms_per_trajectory": 1000 * sum(r["cpu"] for r in rows) / max(trajectories, 1),
        "cpu_share": sum(r["cpu"] for r in rows) / sum(r["wall"] for r in rows),
        "trajectories_per_s": trajectories / sum(r["wall"] for r in rows),
        "infra_errors": sum(r["lost"] for r in rows),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-workers", type=int, default=8, help="largest N (workers); N doubles from 1")
    parser.add_argument("--env-servers", type=int, default=2, help="M remote env servers shared by all workers")
    parser.add_argument("--per-worker", type=int, default=4, help="groups per worker per step (and at once)")
    parser.add_argument("--group-size", type=int, default=8, help="trajectories per group")
    parser.add_argument("--tokens", type=int, default=512, help="tokens the fake engine emits per turn")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per N (after one warm-up step)")
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)
    from model.factory import make_tiny_model
    from sandbox.api import Budgets, EnvSpec
    from controller.tasks import default_task_lister

    work = pathlib.Path(tempfile.mkdtemp(prefix="orrery-scale-"))
    model = make_tiny_model(work / "model", vocab_size=300, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2)
    env_processes, env_addresses = start_env_servers(args.env_servers, work)
    worker_processes = []
    try:
        worker_processes, worker_addresses = start_workers(args.max_workers, model, work, args.per_worker)
        specs = [EnvSpec(name=f"vowels-{j}", kind="remote", remote_address=address,
                         budgets=Budgets(max_turns=2, max_new_tokens_per_turn=args.tokens,
                                         max_total_tokens=args.tokens + 256))
                 for j, address in enumerate(env_addresses)]
        tasks = {spec.name: default_task_lister(spec) for spec in specs}
        sizes = [1]
        while sizes[-1] * 2 <= args.max_workers:
            sizes.append(sizes[-1] * 2)
        if sizes[-1] != args.max_workers:
            sizes.append(args.max_workers)
        results = []
        for n in sizes:
            results.append(measure(n, worker_addresses, specs, tasks, model, work / f"run-{n}", args))
            r = results[-1]
            print(f"N={n:3d}: {r['trajectories_per_step']:.0f} trajectories/step, step {r['step_wall_s']:.2f}s wall, "
                  f"controller {r['step_cpu_s']:.2f}s CPU ({r['cpu_ms_per_trajectory']:.2f} ms/trajectory, "
                  f"{100 * r['cpu_share']:.0f}% of a core), infra errors {r['infra_errors']}", flush=True)
    finally:
        for process in worker_processes + env_processes:
            process.kill()
            process.wait()

    base = results[0]
    print(f"\nM={args.env_servers} env servers, {args.per_worker} groups x {args.group_size} per worker per step, "
          f"{base['tokens_per_trajectory']:.0f} tokens per trajectory, {args.steps} measured steps; "
          f"ratios against N=1 in this run")
    print(f"{'N':>4} {'traj/step':>10} {'wall/step':>10} {'CPU/step':>10} {'CPU ms/traj':>12} "
          f"{'x N=1':>7} {'CPU share':>10} {'traj/s':>8} {'x N=1':>7}")
    for r in results:
        print(f"{r['workers']:>4} {r['trajectories_per_step']:>10.0f} {r['step_wall_s']:>9.2f}s {r['step_cpu_s']:>9.2f}s "
              f"{r['cpu_ms_per_trajectory']:>12.2f} {r['cpu_ms_per_trajectory'] / base['cpu_ms_per_trajectory']:>7.2f} "
              f"{100 * r['cpu_share']:>9.0f}% {r['trajectories_per_s']:>8.0f} "
              f"{r['trajectories_per_s'] / base['trajectories_per_s']:>7.2f}")
    per_traj = statistics.median(r["cpu_ms_per_trajectory"] for r in results)
    print(f"\ncontroller CPU per trajectory (median over N): {per_traj:.2f} ms -> one core saturates near "
          f"{1000 / per_traj:.0f} trajectories/s (see docs/operations.md for the estimate at thousands of workers)")


if __name__ == "__main__":
    main()
