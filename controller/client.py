"""`ControllerClient` and the `python -m controller.client` CLI: submit and manage envs, watch a run.

    python -m controller.client --addr 127.0.0.1:50051 submit examples/envs/calc_hard.yaml
    python -m controller.client --addr 127.0.0.1:50051 envs | get NAME | pause NAME | resume NAME
    python -m controller.client --addr 127.0.0.1:50051 remove NAME | status | watch [--prefix rollout/]

A controller that requires tokens gets one from `--token-file F` or the ORRERY_TOKEN environment
variable (never from a flag's value, which other users could read in the process list);
`--tls-ca` (and `--tls-cert`/`--tls-key` for mutual TLS) connect over TLS.

Every call has a deadline (`deadline_s`); `watch` has none, because its stream lasts the run (it
ends when the run does, or on Ctrl-C). A failed call raises `ControllerError` naming the method,
the peer, the status code and the server's message; the CLI prints that as one line to stderr
and exits 1 (argparse usage errors exit 2).

env.yaml holds one `EnvSpec` (sandbox/api.py) with the same nested keys, e.g.

    name: calc-hard
    kind: calc
    args: {level: 3}
    budgets: {max_turns: 4}
    reward: {outcome: 1.0, format: 0.1}
    tasks: [{task_id: t1, prompt: "What is 2 + 2?", verifier: {answer: 4}}]

Unknown keys are errors that name the key and list the valid ones. The server validates the
values (ranges, names, kinds) and answers INVALID_ARGUMENT with the field, rule and value.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import types
import typing
from typing import Any, Iterator, Mapping

import grpc
import yaml

from controller.registry import EnvRecord, EnvState
from controller.service import RunSnapshot
from orrery.security import ClientSecurity, SecurityError, client_channel
from orrery.v1 import controller_pb2, controller_pb2_grpc
from sandbox import api, wire


class ControllerError(RuntimeError):
    """A ControllerService call failed: which method, which server, what status, what it said."""

    def __init__(self, method: str, peer: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method} to {peer} failed: {code.name}: {details}")
        self.method = method
        self.peer = peer
        self.code = code
        self.details = details


# -- env.yaml -> EnvSpec -------------------------------------------------------------------------


class EnvFileError(ValueError):
    """env.yaml is not an EnvSpec: bad YAML, an unknown key, or a wrong shape."""


def load_env_spec(path: str | pathlib.Path) -> api.EnvSpec:
    """Parse an env.yaml file into an `EnvSpec` (structure only; the controller validates values)."""
    path = pathlib.Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise EnvFileError(f"{path}: cannot read ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise EnvFileError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from None
    try:
        return env_spec_from_dict(data)
    except EnvFileError as error:
        raise EnvFileError(f"{path}: {error}") from None


def env_spec_from_dict(data: Any) -> api.EnvSpec:
    """Build an `EnvSpec` from nested plain data (as YAML or JSON gives it)."""
    return _build(api.EnvSpec, data, "EnvSpec")


def _build(cls: type, data: Any, where: str) -> Any:
    """Instantiate dataclass `cls` from a mapping, recursing into dataclass and tuple-of-dataclass fields."""
    if not isinstance(data, Mapping):
        raise EnvFileError(f"{where}: must be a mapping of keys to values, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise EnvFileError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(fields))}")
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _convert(hints[key], value, f"{where}.{key}")
    required = sorted(f.name for f in dataclasses.fields(cls)
                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    missing = [k for k in required if k not in data]
    if missing:
        raise EnvFileError(f"{where}: missing key {missing[0]!r}; required keys: {', '.join(required)}")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        if not isinstance(value, list):
            raise EnvFileError(f"{where}: must be a list, got {type(value).__name__}")
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):  # `float | None`: the value decides
        return value
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise EnvFileError(f"{where}: must be a mapping, got {type(value).__name__}")
        return dict(value)
    return value  # scalars: the controller's validation checks type and range


# -- the client ----------------------------------------------------------------------------------


def env_record_from_proto(message: controller_pb2.EnvStatus) -> EnvRecord:
    state = {controller_pb2.ENV_STATE_ACTIVE: EnvState.ACTIVE, controller_pb2.ENV_STATE_PAUSED: EnvState.PAUSED}
    return EnvRecord(
        spec=wire.env_spec_from_proto(message.spec),
        state=state[message.state],
        submitted_step=message.submitted_step,
        groups_sampled=message.groups_sampled,
        success_rate=message.success_rate,
    )


def _run_snapshot_from_proto(message: controller_pb2.GetRunStatusResponse) -> RunSnapshot:
    w = message.weights
    weights = {"version": w.version, "learner_step": w.learner_step, "location": w.location,
               "format": w.format, "digest": w.digest, "created_unix_s": w.created_unix_s}
    return RunSnapshot(step=message.step, total_steps=message.total_steps, mode=message.mode, weights=weights,
                       rollout_workers=message.rollout_workers, finished=message.finished,
                       latest_metrics=dict(message.latest_metrics))


class ControllerClient:
    """A connection to one controller. Thread-safe; `close()` (or `with`) releases the channel."""

    def __init__(self, addr: str, deadline_s: float = 10.0, security: ClientSecurity = ClientSecurity()):
        self.addr = addr
        self.deadline_s = deadline_s
        # Specs are capped at a few MiB each (SpecLimits); a list of many of them can be large.
        self._channel = client_channel(addr, security, max_receive_bytes=256 << 20, max_send_bytes=16 << 20)
        self._stub = controller_pb2_grpc.ControllerServiceStub(self._channel)

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.deadline_s)
        except grpc.RpcError as error:
            raise ControllerError(method, self.addr, error.code(), error.details() or "") from None

    def submit(self, spec: api.EnvSpec | str | pathlib.Path, *, replace: bool = False) -> EnvRecord:
        """Submit an `EnvSpec` or the path of an env.yaml; returns the registered env."""
        if not isinstance(spec, api.EnvSpec):
            spec = load_env_spec(spec)
        request = controller_pb2.SubmitEnvRequest(spec=wire.env_spec_to_proto(spec), replace=replace)
        return env_record_from_proto(self._call("SubmitEnv", request).env)

    def list_envs(self) -> list[EnvRecord]:
        return [env_record_from_proto(e) for e in self._call("ListEnvs", controller_pb2.ListEnvsRequest()).envs]

    def get_env(self, name: str) -> EnvRecord:
        return env_record_from_proto(self._call("GetEnv", controller_pb2.GetEnvRequest(name=name)).env)

    def pause(self, name: str) -> EnvRecord:
        return env_record_from_proto(self._call("PauseEnv", controller_pb2.PauseEnvRequest(name=name)).env)

    def resume(self, name: str) -> EnvRecord:
        return env_record_from_proto(self._call("ResumeEnv", controller_pb2.ResumeEnvRequest(name=name)).env)

    def remove(self, name: str) -> None:
        self._call("RemoveEnv", controller_pb2.RemoveEnvRequest(name=name))

    def status(self) -> RunSnapshot:
        return _run_snapshot_from_proto(self._call("GetRunStatus", controller_pb2.GetRunStatusRequest()))

    def watch(self, prefix: str = "", timeout_s: float | None = None) -> Iterator[tuple[int, dict[str, float]]]:
        """Yield (step, metrics) per learner step until the run ends. Closing the iterator cancels the stream."""
        stream = self._stub.StreamMetrics(controller_pb2.StreamMetricsRequest(prefix=prefix), timeout=timeout_s)
        try:
            for message in stream:
                yield message.step, dict(message.metrics)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                raise ControllerError("StreamMetrics", self.addr, error.code(), error.details() or "") from None
        finally:
            stream.cancel()


# -- the CLI -------------------------------------------------------------------------------------

TOKEN_ENV = "ORRERY_TOKEN"  # where the CLI finds the token without --token-file (never a flag value)

HEADLINE = ("rollout/success_rate", "reward/mean", "reward/true_metric", "staleness/mean", "learner/loss",
            "perf/rollout_tokens_per_s")


def _format_record(r: EnvRecord) -> str:
    return (f"{r.name:<24} {r.spec.kind:<8} {r.state.value:<7} weight={r.spec.mixture_weight:g} "
            f"submitted_step={r.submitted_step} groups={r.groups_sampled} success={r.success_rate:.3f}")


def _format_metrics(metrics: Mapping[str, float], keys: tuple[str, ...]) -> str:
    shown = [k for k in keys if k in metrics] or sorted(metrics)
    return " ".join(f"{k}={_number(metrics[k])}" for k in shown)


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m controller.client", description="Talk to an Orrery controller.")
    parser.add_argument("--addr", required=True, help="controller address, HOST:PORT")
    parser.add_argument("--deadline-s", type=float, default=10.0, help="deadline of each call in seconds")
    parser.add_argument("--token-file", default="",
                        help=f"file holding the bearer token (default: the {TOKEN_ENV} environment variable)")
    parser.add_argument("--tls-ca", default="", help="PEM CA of the controller's certificate (TLS)")
    parser.add_argument("--tls-cert", default="", help="PEM client certificate (mutual TLS)")
    parser.add_argument("--tls-key", default="", help="PEM key of --tls-cert")
    parser.add_argument("--tls-server-name", default="", help="name to check the certificate against")
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="submit an env from a YAML file")
    submit.add_argument("path", help="env.yaml (an EnvSpec)")
    submit.add_argument("--replace", action="store_true", help="replace an env of the same name")
    commands.add_parser("envs", help="list envs")
    for name, text in (("get", "show one env as JSON"), ("pause", "stop sampling an env"),
                       ("resume", "sample a paused env again"), ("remove", "remove an env")):
        commands.add_parser(name, help=text).add_argument("name")
    commands.add_parser("status", help="run status and latest metrics")
    watch = commands.add_parser("watch", help="print metrics per step until the run ends")
    watch.add_argument("--prefix", default="", help="only metrics whose name starts with this")
    watch.add_argument("--json", action="store_true", help="one JSON object per step")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    security = ClientSecurity(token_file=args.token_file, token_env=TOKEN_ENV, tls_ca=args.tls_ca,
                              tls_cert=args.tls_cert, tls_key=args.tls_key, tls_server_name=args.tls_server_name)
    try:
        with ControllerClient(args.addr, deadline_s=args.deadline_s, security=security) as client:
            return _run(client, args)
    except (ControllerError, EnvFileError, SecurityError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(client: ControllerClient, args: argparse.Namespace) -> int:
    if args.command == "submit":
        print("submitted", _format_record(client.submit(args.path, replace=args.replace)))
    elif args.command == "envs":
        records = client.list_envs()
        for r in records:
            print(_format_record(r))
        if not records:
            print("no envs")
    elif args.command == "get":
        r = client.get_env(args.name)
        spec = json.loads(json.dumps(dataclasses.asdict(r.spec), default=str))
        print(json.dumps({"state": r.state.value, "submitted_step": r.submitted_step,
                          "groups_sampled": r.groups_sampled, "success_rate": r.success_rate, "spec": spec}, indent=2))
    elif args.command in ("pause", "resume"):
        print(f"{args.command}d", _format_record(getattr(client, args.command)(args.name)))
    elif args.command == "remove":
        client.remove(args.name)
        print(f"removed {args.name}")
    elif args.command == "status":
        s = client.status()
        print(f"step {s.step}/{s.total_steps} mode={s.mode} weights=v{s.weights['version']} "
              f"rollout_workers={s.rollout_workers} finished={s.finished}")
        for key in sorted(s.latest_metrics):
            print(f"  {key} = {_number(s.latest_metrics[key])}")
    elif args.command == "watch":
        for step, metrics in client.watch(prefix=args.prefix):
            if args.json:
                print(json.dumps({"step": step, **metrics}), flush=True)
            else:
                print(f"step {step} {_format_metrics(metrics, HEADLINE)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
