"""`python -m controller.main --mesh [SPEC] ...`: the one process that turns the crank.

With no config this is the embedded CPU demo: make (or reuse) a tiny model and tokenizer in
the run directory, warm-start it on `calc` demonstrations, spawn two local rollout workers
over gRPC, train with GRPO, and end with a summary table and run_dir/report.html.
Parse, build, call one function: the loop is `controller/loop.py` (or `loop_async.py`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from controller import config as config_lib


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m controller.main", description=__doc__.splitlines()[0])
    p.add_argument("--mesh", nargs="?", const="", default=None, metavar="SPEC",
                   help="learner device mesh, e.g. 'data=1,fsdp=-1' (one axis may be -1: the rest); "
                        "a bare --mesh uses all local devices")
    p.add_argument("--config", metavar="FILE", help="YAML file with any RunConfig fields (nested sections)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. --set learner.learning_rate=1e-4 (repeatable)")
    p.add_argument("--run-dir", help="directory for the model cache, checkpoints, weights, metrics and report")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="STEP",
                   help="continue from the latest checkpoint in the run directory, or from checkpoint STEP "
                        "(completed RL steps; newer checkpoints are discarded); any mesh shape")
    p.add_argument("--listen", metavar="ADDR", help="ControllerService address (default 127.0.0.1:0, loopback)")
    p.add_argument("--rollout-workers", type=int, metavar="N", help="local rollout worker processes to spawn")
    p.add_argument("--rollout-addresses", metavar="HOST:PORT,...", help="use running rollout workers instead")
    p.add_argument("--rollout-dns", metavar="NAME:PORT",
                   help="discover rollout workers as NAME's address records, re-resolved while the run goes on "
                        "(e.g. a Kubernetes headless service)")
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help="multi-host learner: serve jax.distributed's coordinator here (this controller is process 0)")
    p.add_argument("--num-processes", type=int, metavar="N",
                   help="multi-host learner: JAX processes including this one (the others run python -m learner.host)")
    p.add_argument("--engine", choices=["jax", "sglang"], help="engine of spawned workers (default jax)")
    p.add_argument("--mode", choices=["sync", "async"], help="sync: rollout then train; async: overlap them")
    p.add_argument("--max-staleness", type=int, metavar="K",
                   help="async: admit a sample only if all its tokens are within K versions of the learner")
    p.add_argument("--steps", type=int, metavar="N", help="RL learner steps")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def _resume_flag(value: str | None) -> tuple[bool | None, int | None]:
    """--resume (latest) or --resume STEP -> (resume, resume_step) for the config."""
    if value is None:
        return None, None
    if value == "latest":
        return True, -1
    try:
        step = int(value)
    except ValueError:
        raise ValueError(f"--resume STEP must be a checkpoint step (an integer >= 0), got {value!r}") from None
    if step < 0:
        raise ValueError(f"--resume STEP must be a checkpoint step (an integer >= 0), got {value!r}")
    return True, step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("absl", "jax._src", "orbax", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        resume, resume_step = _resume_flag(args.resume)
        config = config_lib.load(
            args.config, tuple(args.overrides),
            mesh=args.mesh, run_dir=args.run_dir, resume=resume, resume_step=resume_step, listen=args.listen,
            steps=args.steps, mode=args.mode, max_staleness=args.max_staleness,
            **{"fleet.workers": args.rollout_workers, "fleet.engine": args.engine,
               "fleet.addresses": args.rollout_addresses.split(",") if args.rollout_addresses else None,
               "fleet.dns": args.rollout_dns, "distributed.coordinator": args.coordinator,
               "distributed.num_processes": args.num_processes})
        from learner.multihost import initialize

        initialize(config.distributed)  # before JAX's first use: the device list becomes every host's
        from learner.sharding import parse_mesh_spec, select_devices

        # a bad --mesh or device set fails here, clearly
        parse_mesh_spec(config.mesh or None, num_devices=len(select_devices(config.devices.learner)))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.mode == "async":
        from controller.loop_async import run
    else:
        from controller.loop import run
    from controller.fleet import FleetError
    from controller.pipeline import ResumeError

    from learner.multihost import stop_followers

    try:
        summary = run(config)
    except (FleetError, ResumeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        stop_followers()  # learner hosts leave too, however the run ended (no-op when already told)
    return 0 if summary.get("steps", 0) == config.steps else 1


if __name__ == "__main__":
    sys.exit(main())
