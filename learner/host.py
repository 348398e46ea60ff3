"""`python -m learner.host --coordinator HOST:PORT --num-processes N --process-id I`: a learner host.

One process per extra host of a multi-host learner. It joins process 0's `jax.distributed`
runtime (process 0 is the controller, started with `--coordinator` and `--num-processes`),
lends its devices to the learner mesh and replays the controller's learner calls
(learner/multihost.py) until the controller says stop. It talks to nothing else: no rollout
workers, no clients. Exit status 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import logging
import sys

from learner.config import DistributedConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m learner.host", description=__doc__.splitlines()[0])
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT",
                   help="address of process 0's coordination service (the controller's --coordinator)")
    p.add_argument("--num-processes", type=int, required=True, metavar="N",
                   help="JAX processes in the learner, the controller included")
    p.add_argument("--process-id", type=int, required=True, metavar="I", help="this host's index, 1..N-1")
    p.add_argument("--local-cpu-devices", type=int, default=0, metavar="K",
                   help="CPU backend only: devices this process exposes (tests, simulation)")
    p.add_argument("--timeout-s", type=int, default=300, help="longest wait for the other processes at start")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("absl", "jax._src", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        config = DistributedConfig(coordinator=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id, local_cpu_devices=args.local_cpu_devices,
                                   timeout_s=args.timeout_s)
        if config.process_id == 0:
            raise ValueError("learner.host --process-id must be >= 1 (process 0 is the controller)")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from learner import multihost

    multihost.initialize(config)
    multihost.follow()
    import jax

    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
