"""Rollout worker process: `python -m rollout.server --engine jax --listen 127.0.0.1:0 --model DIR`.

Thin: parse flags into a `RolloutConfig`, build the engine and agent loop, serve
RolloutService (+ health + reflection) until SIGTERM/SIGINT. It logs and prints the bound
address ("rollout server <worker-id> listening on HOST:PORT"); `--listen HOST:0` picks a free
port, and `--port-file F` receives that port (written atomically) once the engine has compiled
its first shapes and the server accepts calls.

Engines: `jax` (the embedded JaxEngine on the HF folder `--model`), `fake` (FakeEngine, for
tests of the controller; `--model` still supplies the tokenizer), `sglang` (built by
`rollout.sglang.build_engine(args)`, owned by the SGLang engine's module). Envs are opened with
`sandbox.client.open_env` (built-in kinds and remote EnvServices).

Security (orrery/security.py, docs/threat-model.md): `--weights-root DIR` (repeatable) names the
folders weight snapshots may be loaded from; without one the worker loads no weight updates.
The default listen address is loopback; any other needs `--tls-cert/--tls-key` and
`--tokens-file` (the controller's token needs role `internal`); `--tls-client-ca` adds mutual
TLS. No secret is ever a flag value: tokens live in files, the SGLang API key in
`--sglang-api-key-file` or the ORRERY_SGLANG_API_KEY environment variable.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from rollout.config import ENGINES, AgentConfig, JaxEngineConfig, RolloutConfig

logger = logging.getLogger("rollout.server")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Orrery rollout worker (RolloutService over gRPC).")
    p.add_argument("--engine", default="jax", choices=ENGINES)
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 picks a free one")
    p.add_argument("--model", required=True, help="HF model folder (config, safetensors, tokenizer)")
    p.add_argument("--worker-id", default="rollout-0")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--slots", type=int, default=JaxEngineConfig.slots, help="decode batch (jax)")
    p.add_argument("--max-seq-len", type=int, default=JaxEngineConfig.max_seq_len)
    p.add_argument("--prefill-buckets", default=",".join(map(str, JaxEngineConfig.prefill_buckets)),
                   help="comma-separated prefill lengths (jax)")
    p.add_argument("--decode-steps", type=int, default=JaxEngineConfig.decode_steps_per_call)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--interrupt-on-update", action="store_true",
                   help="switch weights mid-request instead of draining (jax)")
    p.add_argument("--max-concurrent-groups", type=int, default=RolloutConfig.max_concurrent_groups)
    p.add_argument("--seed", type=int, default=0, help="mixed into every sample's sampling seed")
    p.add_argument("--sglang-url", default="", help="SGLang server URL (engine sglang)")
    p.add_argument("--compile-cache", default=os.path.join(tempfile.gettempdir(),
                                                            f"orrery-jax-cache-{os.getuid()}"),
                   help="JAX persistent compilation cache folder ('' disables); restarts and "
                        "sibling workers with the same shapes skip compiling")
    p.add_argument("--weights-root", action="append", default=[], metavar="DIR",
                   help="folder weight snapshots may be loaded from (repeatable; symlinks resolved); "
                        "without one, UpdateWeights is refused")
    p.add_argument("--tls-cert", default="", help="PEM server certificate (TLS)")
    p.add_argument("--tls-key", default="", help="PEM key of --tls-cert")
    p.add_argument("--tls-client-ca", default="", help="PEM CA; clients must present a certificate it signed")
    p.add_argument("--tokens-file", default="",
                   help="tokens file (name, sha256, roles); set, every call needs a token")
    p.add_argument("--sglang-api-key-file", default="",
                   help="file holding the SGLang server's --api-key (default: $ORRERY_SGLANG_API_KEY)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def security_from_args(args: argparse.Namespace):
    from orrery.security import ServerSecurity

    return ServerSecurity(tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
                          tokens_file=args.tokens_file)


def config_from_args(args: argparse.Namespace) -> RolloutConfig:
    buckets = tuple(int(b) for b in args.prefill_buckets.split(",") if b)
    jax_config = JaxEngineConfig(slots=args.slots, max_seq_len=args.max_seq_len,
                                 prefill_buckets=tuple(b for b in buckets if b <= args.max_seq_len),
                                 decode_steps_per_call=args.decode_steps, dtype=args.dtype,
                                 interrupt_on_update=args.interrupt_on_update)
    return RolloutConfig(engine=args.engine, worker_id=args.worker_id, jax=jax_config,
                         agent=AgentConfig(), max_concurrent_groups=args.max_concurrent_groups)


def build_engine(args: argparse.Namespace, config: RolloutConfig):
    if config.engine == "jax":
        import jax

        from rollout.engine_jax import JaxEngine

        if args.compile_cache and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            jax.config.update("jax_compilation_cache_dir", args.compile_cache)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

        engine = JaxEngine.from_hf_dir(args.model, config.jax)
        engine.warmup()
        return engine
    if config.engine == "fake":
        from rollout.fake import FakeEngine

        return FakeEngine()
    from rollout import sglang  # the SGLang engine's module builds itself from these flags

    return sglang.build_engine(args)


def _write_port(path: str, port: int) -> None:
    tmp = Path(f"{path}.tmp{os.getpid()}")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)

    from orrery.security import SecurityError, check_server

    security = security_from_args(args)
    try:  # before the engine loads: a refused address is one line, at once
        check_server("RolloutService", args.listen, security)
    except SecurityError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)

    from model.tokenizer import Tokenizer
    from rollout.agent import AgentLoop
    from sandbox.client import open_env
    from rollout.service import serve
    from rollout.worker import RolloutWorker

    try:
        engine = build_engine(args, config)
    except ValueError as error:  # e.g. an SGLang URL beyond loopback without an API key
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    agent = AgentLoop(engine, Tokenizer.from_dir(args.model), open_env, config.agent,
                      seed=args.seed)
    running = serve(RolloutWorker(engine, agent, config), args.listen, security=security,
                    weights_roots=tuple(args.weights_root))
    host = args.listen.rsplit(":", 1)[0]
    logger.info("rollout server %s (%s engine) listening on %s:%d", config.worker_id,
                config.engine, host, running.port)
    print(f"rollout server {config.worker_id} listening on {host}:{running.port}", flush=True)
    if args.port_file:
        _write_port(args.port_file, running.port)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Wake up now and then: a signal delivered to one of JAX's or gRPC's threads only sets a
    # flag, and the Python handler runs when the main thread next runs bytecode.
    while not stop.wait(0.2):
        pass
    logger.info("stopping (grace %.1fs)", config.shutdown_grace_s)
    running.stop(config.shutdown_grace_s)
    close = getattr(engine, "close", None)
    if close is not None:
        close()
    logger.info("stopped")
    # Deliberate: skip interpreter teardown. Abandoned daemon threads (an env call past its
    # deadline, an aborted episode) may still be inside JAX or gRPC, and finalising the
    # interpreter under them can crash the process after a clean stop.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
