"""Coverage-guided fuzzing (atheris, libFuzzer) of what a client can send about an environment.

Three doors, picked by the first input byte:
  0: bytes -> EnvSpec proto -> `sandbox.wire` -> `sandbox.validation` (what SubmitEnv does)
  1: bytes -> env.yaml text -> `controller.client.env_spec_from_dict` -> validation (the CLI)
  2: bytes -> RolloutGroupRequest proto -> `rollout.wire` -> validation (what a worker does)
Each must return or raise the documented error (DecodeError/YAMLError for bytes that are not
the format, then SpecError/EnvFileError); anything else is a crash that libFuzzer reports with
the input that caused it.

    .venv/bin/python tests/security/fuzz_specs.py --write-seeds corpus/  # valid inputs of each door
    .venv/bin/python tests/security/fuzz_specs.py corpus/ -max_total_time=300   # libFuzzer flags

tests/security/test_atheris.py runs it briefly in the default test run. Not collected by pytest
(the file name does not start with test_).
"""

from __future__ import annotations

import pathlib
import sys

import atheris

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.setrecursionlimit(10_000)

import yaml  # noqa: E402  (libraries: not instrumented, their coverage is not ours to explore)
from google.protobuf.message import DecodeError  # noqa: E402

with atheris.instrument_imports(include=["sandbox.validation", "sandbox.wire", "sandbox.api", "rollout.wire", "controller.client"]):  # coverage feedback here
    from controller.client import EnvFileError, env_spec_from_dict
    from orrery.v1 import env_pb2, rollout_pb2
    from rollout import wire as rollout_wire
    from sandbox import validation, wire

KINDS = ("calc", "code", "files")


def _validate(spec) -> None:
    try:
        validation.validate_env_spec(spec, known_kinds=KINDS)
    except validation.SpecError:
        pass


def test_one_input(data: bytes) -> None:
    if not data:
        return
    door, body = data[0] % 3, data[1:]
    if door == 0:
        message = env_pb2.EnvSpec()
        try:
            message.ParseFromString(body)
        except DecodeError:
            return
        try:
            spec = wire.env_spec_from_proto(message)
        except ValueError:
            return  # a Struct that is not plain JSON (NaN): SubmitEnv answers INVALID_ARGUMENT
        _validate(spec)
    elif door == 1:
        try:
            loaded = yaml.safe_load(body.decode("utf-8", "replace"))
        except (yaml.YAMLError, RecursionError):
            return  # not YAML (load_env_spec reports both as "not valid YAML")
        try:
            _validate(env_spec_from_dict(loaded))
        except EnvFileError:
            pass
    else:
        message = rollout_pb2.RolloutGroupRequest()
        try:
            message.ParseFromString(body)
        except DecodeError:
            return
        try:
            group = rollout_wire.group_request_from_proto(message)
        except ValueError:
            return  # the worker answers INVALID_ARGUMENT
        _validate(group.env)
        try:
            validation.validate_task(group.task, "RolloutGroupRequest.task")
        except validation.SpecError:
            pass


def write_seeds(folder: pathlib.Path) -> None:
    """Valid inputs of each door, so mutation starts from messages that get past parsing."""
    from sandbox import api

    folder.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = api.EnvSpec(name="calc-seed", kind="calc", args={"num_tasks": 4},
                       tasks=(api.Task("t1", "What is 1 + 1?", {"answer": 2}),),
                       safety=api.SafetyPolicy(protected_paths=("keep.txt",)))
    files = api.EnvSpec(name="files-seed", kind="files",
                        tasks=(api.Task("f1", "Tidy.", {"files": {"a/b.txt": "x"}}),))
    seeds = {"spec-calc": b"\x00" + wire.env_spec_to_proto(spec).SerializeToString(),
             "spec-files": b"\x00" + wire.env_spec_to_proto(files).SerializeToString(),
             "group": b"\x02" + rollout_pb2.RolloutGroupRequest(
                 group_id="g", env=wire.env_spec_to_proto(spec), task=wire.task_to_proto(spec.tasks[0]),
                 group_size=2).SerializeToString()}
    for path in sorted((root / "examples" / "envs").glob("*.yaml")):
        seeds[f"yaml-{path.stem}"] = b"\x01" + path.read_bytes()
    for name, data in seeds.items():
        (folder / name).write_bytes(data)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-seeds":
        write_seeds(pathlib.Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
