"""ControllerClient and its CLI: env.yaml parsing, and real processes talking over loopback gRPC.

Proves that env.yaml becomes sandbox.api dataclasses with clear errors for unknown keys, that
`python -m controller.client ... submit examples/envs/calc_hard.yaml` registers the env in a
controller running in another process, and that failures exit non-zero with one line on stderr.
Run: `.venv/bin/python -m pytest tests/controller/test_client.py`.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from controller import client as cli
from controller.client import EnvFileError, env_spec_from_dict, load_env_spec
from controller.registry import EnvRegistry, EnvState
from controller.service import RunStatus, serve_controller
from sandbox import api
from sandbox.validation import validate_env_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "envs" / "calc_hard.yaml"
ENV_SPEC_KEYS = ("args, budgets, eval_fraction, kind, mixture_weight, name, remote_address, reward, safety, "
                 "sampling, tasks, tools")


def test_example_yaml_is_a_valid_calc_level_3_spec():
    spec = load_env_spec(EXAMPLE)
    assert (spec.name, spec.kind, spec.args["level"]) == ("calc-hard", "calc", 3)
    assert spec.budgets == api.Budgets(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=512)
    assert spec.reward == api.RewardWeights(outcome=1.0, format=0.1)
    validate_env_spec(spec)  # against the real built-in kinds
    from sandbox.envs import generate_tasks

    tasks = generate_tasks(spec)
    assert len(tasks) == 256 and sum(t.split == "eval" for t in tasks) == 32  # eval_fraction 0.125


def test_nested_yaml_becomes_dataclasses(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text(textwrap.dedent("""\
        name: files-a
        kind: files
        tasks:
          - {task_id: t1, prompt: "Fix it", verifier: {answer: 4}, split: eval}
        tools:
          - {name: sh, cost_per_call: 0.5, parameters: {type: object}}
        safety: {protected_paths: [a.txt, b/c.txt], forbid_network: false}
        sampling: {temperature: 0.5}
        """))
    spec = load_env_spec(path)
    assert spec.tasks == (api.Task("t1", "Fix it", verifier={"answer": 4}, split="eval"),)
    assert spec.tools == (api.ToolSpec("sh", parameters={"type": "object"}, cost_per_call=0.5),)
    assert spec.safety == api.SafetyPolicy(forbid_network=False, protected_paths=("a.txt", "b/c.txt"))
    assert spec.sampling == api.SamplingOverrides(temperature=0.5)


@pytest.mark.parametrize("data, message", [
    ({"name": "a", "kind": "calc", "budget": {}}, f"EnvSpec: unknown key 'budget'; valid keys: {ENV_SPEC_KEYS}"),
    ({"name": "a", "budgets": {"max_turn": 3}}, "EnvSpec.budgets: unknown key 'max_turn'; valid keys: "
     "max_new_tokens_per_turn, max_tool_cost, max_total_tokens, max_turns, tool_timeout_s"),
    ({"tasks": [{"task_id": "a", "prompt": "p"}, {"task_id": "b", "promt": "p"}]},
     "EnvSpec.tasks[1]: unknown key 'promt'; valid keys: metadata, prompt, split, task_id, verifier"),
    ({"tasks": {"a": 1}}, "EnvSpec.tasks: must be a list, got dict"),
    ({"reward": 1.0}, "EnvSpec.reward: must be a mapping of keys to values, got float"),
    ({"args": [1, 2]}, "EnvSpec.args: must be a mapping, got list"),
    (["name"], "EnvSpec: must be a mapping of keys to values, got list"),
])
def test_bad_env_dicts_name_the_key(data, message):
    with pytest.raises(EnvFileError) as error:
        env_spec_from_dict(data)
    assert str(error.value) == message


def test_bad_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(EnvFileError, match=r"bad\.yaml: not valid YAML"):
        load_env_spec(path)
    with pytest.raises(EnvFileError, match=r"missing\.yaml: cannot read"):
        load_env_spec(tmp_path / "missing.yaml")


# -- the CLI against a controller in another process ---------------------------------------------

SERVER_SCRIPT = """
import sys
from controller.registry import EnvRegistry
from controller.service import RunStatus, serve_controller
server, port = serve_controller(EnvRegistry(known_kinds=("calc",)), RunStatus(total_steps=5))
print(port, flush=True)
sys.stdin.read()  # serve until the test closes our stdin
server.stop(None)
"""


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def controller_process():
    process = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], cwd=ROOT, env=_env(), text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        port = int(process.stdout.readline())
        yield f"127.0.0.1:{port}"
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _cli(addr, *args):
    return subprocess.run([sys.executable, "-m", "controller.client", "--addr", addr, *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)


def test_cli_submit_example_to_a_separate_process(controller_process):
    addr = controller_process
    done = _cli(addr, "submit", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("submitted calc-hard")
    with cli.ControllerClient(addr) as client:  # and the other process really has it
        record = client.get_env("calc-hard")
    assert record.state is EnvState.ACTIVE and record.spec == load_env_spec(EXAMPLE)

    again = _cli(addr, "get", "missing")
    assert again.returncode == 1
    assert again.stdout == ""
    assert again.stderr == (f"error: GetEnv to {addr} failed: NOT_FOUND: no env named 'missing'; "
                            "registered envs: 'calc-hard'\n")


# -- every CLI command, in-process, against a loopback server ------------------------------------


@pytest.fixture
def local():
    registry = EnvRegistry(known_kinds=("calc",))
    status = RunStatus(total_steps=5, rollout_workers=2)
    server, port = serve_controller(registry, status)
    yield registry, status, f"127.0.0.1:{port}"
    status.close()
    server.stop(None)


def test_cli_commands(local, capsys):
    registry, status, addr = local

    def run(*args):
        code = cli.main(["--addr", addr, *args])
        out, err = capsys.readouterr()
        return code, out, err

    assert run("envs") == (0, "no envs\n", "")
    assert run("submit", str(EXAMPLE))[0] == 0
    code, out, _ = run("envs")
    assert code == 0 and out.startswith("calc-hard") and "active" in out
    code, out, _ = run("get", "calc-hard")
    shown = json.loads(out)
    assert shown["spec"]["args"] == {"level": 3, "num_tasks": 256, "seed": 1} and shown["state"] == "active"
    assert run("pause", "calc-hard")[1].startswith("paused calc-hard")
    assert registry.get("calc-hard").state is EnvState.PAUSED
    assert run("resume", "calc-hard")[1].startswith("resumed calc-hard")
    code, _, err = run("submit", str(EXAMPLE))
    assert code == 1 and "ALREADY_EXISTS" in err and err.count("\n") == 1
    assert run("submit", "--replace", str(EXAMPLE))[0] == 0
    status.log(2, {"rollout/success_rate": 0.5, "learner/loss": 0.25})
    code, out, _ = run("status")
    assert code == 0 and out.splitlines() == [
        "step 2/5 mode=sync weights=v0 rollout_workers=2 finished=False",
        "  learner/loss = 0.25", "  rollout/success_rate = 0.5"]
    assert run("remove", "calc-hard") == (0, "removed calc-hard\n", "")
    assert registry.list() == []


def test_cli_watch_prints_each_step_until_the_run_ends(local, capsys):
    _, status, addr = local

    def feed():
        while status.subscriber_count == 0:
            threading.Event().wait(0.01)
        status.log(1, {"rollout/success_rate": 0.25, "other": 1.0})
        status.log(2, {"rollout/success_rate": 0.5, "other": 1.0})
        status.close()

    threading.Thread(target=feed).start()
    assert cli.main(["--addr", addr, "watch"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step 1 rollout/success_rate=0.25", "step 2 rollout/success_rate=0.5"]


def test_cli_bad_yaml_and_unreachable_server_fail_with_one_line(tmp_path, capsys):
    bad = tmp_path / "env.yaml"
    bad.write_text("name: a\nkind: calc\nbudgets: {max_turn: 3}\n")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    assert cli.main(["--addr", dead, "submit", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: EnvSpec.budgets: unknown key 'max_turn'; valid keys: ") and err.count("\n") == 1
    assert cli.main(["--addr", dead, "--deadline-s", "2", "envs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: ListEnvs to {dead} failed: UNAVAILABLE: ") and err.count("\n") == 1
