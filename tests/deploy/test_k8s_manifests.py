"""The Kubernetes manifests in deploy/k8s are valid objects and agree with the run config.

Proves: every object `kustomize build` makes of the base and of each overlay validates, strictly
(no unknown fields), against the Kubernetes API schemas shipped by the `kubernetes-validate`
package (no network); the run config in each ConfigMap loads through `controller.config.load`;
and the parts that must agree do: the learner hosts' process count and ids vs
`distributed.num_processes`, the coordinator address vs the controller's StatefulSet and
headless service, `fleet.dns` vs the rollout workers' headless service and port, the claims and
config maps the pods mount vs the objects that exist.

Rendering uses `kubectl kustomize` (kubectl ships kustomize); without kubectl only the base's
files are validated one by one and the overlay tests skip. Run: `.venv/bin/python -m pytest -q
-p no:cacheprovider tests/deploy` (seconds).
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33.0"  # the oldest release the manifests promise (pod-index label: 1.28+)
TARGETS = ["base", "overlays/gpu", "overlays/cpu-demo"]


def _render(target: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run([kubectl, "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: found {len(found)}"
    return found[0]


def test_base_files_validate_one_by_one():
    files = sorted(p for p in (K8S / "base").glob("*.yaml") if p.name not in ("kustomization.yaml", "run.yaml"))
    assert len(files) >= 5
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_objects_validate_against_the_schemas(target):
    docs = _render(target)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["Namespace", "PersistentVolumeClaim", "ConfigMap", "Service", "Service", "Service",
                            "StatefulSet", "StatefulSet", "Deployment"])
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "orrery"


def test_the_validator_refuses_a_misspelt_field():
    # The check above can fail: a field the API does not have is an error in strict mode.
    docs = _render("base")
    statefulset = _one(docs, "StatefulSet", "orrery-learner")
    statefulset["spec"]["replica"] = statefulset["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError, match="'replica' was unexpected"):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_manifests_agree_with_the_run_config(target, tmp_path):
    from controller.config import load

    docs = _render(target)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(config_map["data"]["run.yaml"])
    config = load(str(run_yaml))

    # Learner hosts: replicas + 1 processes; pod i is process i + 1; all dial the coordinator.
    controller = _one(docs, "StatefulSet", "orrery-controller")
    learner = _one(docs, "StatefulSet", "orrery-learner")
    assert config.distributed.num_processes == learner["spec"]["replicas"] + 1
    script = learner["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert f"--num-processes {config.distributed.num_processes}" in script
    assert "--process-id $((POD_INDEX + 1))" in script
    assert f"--coordinator {config.distributed.coordinator}" in script
    host, port = config.distributed.coordinator.rsplit(":", 1)
    assert host == f"{controller['metadata']['name']}-0.{controller['spec']['serviceName']}"
    coordinator_service = _one(docs, "Service", controller["spec"]["serviceName"])
    assert coordinator_service["spec"]["clusterIP"] == "None"
    assert int(port) in [p["port"] for p in coordinator_service["spec"]["ports"]]
    assert learner["spec"]["podManagementPolicy"] == "Parallel"

    # Rollout workers: fleet.dns names a headless service (one address record per ready pod).
    dns_host, dns_port = config.fleet.dns.rsplit(":", 1)
    rollout_service = _one(docs, "Service", dns_host)
    assert rollout_service["spec"]["clusterIP"] == "None"
    assert int(dns_port) in [p["port"] for p in rollout_service["spec"]["ports"]]
    rollout = _one(docs, "Deployment", "orrery-rollout")
    assert rollout_service["spec"]["selector"].items() <= rollout["spec"]["template"]["metadata"]["labels"].items()
    worker = [c for c in rollout["spec"]["template"]["spec"]["containers"] if "rollout.server" in c["command"]]
    assert len(worker) == 1
    assert f"--listen=0.0.0.0:{dns_port}" in worker[0]["command"]
    assert f"--engine={config.fleet.engine}" in worker[0]["command"]
    assert f"--weights-root={config.run_dir}/weights" in worker[0]["command"]

    # Everything a pod mounts exists (claims, the generated config map), and the controller reads
    # the config from where the map is mounted.
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for workload in (controller, learner, rollout):
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
    command = controller["spec"]["template"]["spec"]["containers"][0]["command"]
    mounts = {m["name"]: m["mountPath"] for m in controller["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert command[command.index("--config") + 1] == f"{mounts['run-config']}/run.yaml"
    assert re.match(r"^/runs(/|$)", config.run_dir) and mounts["runs"] == "/runs"


def test_gpu_overlay_gives_each_rollout_pod_one_gpu_and_sglang():
    docs = _render("overlays/gpu")
    rollout = _one(docs, "Deployment", "orrery-rollout")
    containers = {c["name"]: c for c in rollout["spec"]["template"]["spec"]["containers"]}
    assert containers["sglang"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--host=127.0.0.1" in containers["sglang"]["command"]  # SGLang itself is never exposed
    assert "--sglang-url=http://127.0.0.1:30000" in containers["worker"]["command"]
    for name in ("orrery-controller", "orrery-learner"):
        statefulset = _one(docs, "StatefulSet", name)
        assert statefulset["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
