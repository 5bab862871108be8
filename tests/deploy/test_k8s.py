"""deploy/k8s: every overlay renders (tests/deploy/kustomize_subset.py), every rendered manifest is
valid against the Kubernetes schemas of a named version (``kubernetes-validate``, offline, strict), and
the wiring agrees with the real CLI: container args parse with ``vcasync``'s own parser, run.toml loads
with its own loader, ports, the Service, the secret the CLI reads, the state URL, the grace periods."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest

from vcasync.cli import available_commands, build_parser, read_join_credential, read_join_secret
from vcasync.commands import coordinator as coordinator_cmd
from vcasync.commands import worker as worker_cmd
from vcasync.runconfig import load_run_config
from vcasync.server._routes import PUBLIC_ROUTES
from vcasync.storage import url_scheme

from .kustomize_subset import Unsupported, render

K8S_VERSION = "1.33.0"
ROOT = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OVERLAYS = {"base": ROOT / "base", "gke-spot": ROOT / "overlays" / "gke-spot",
            "eks-spot": ROOT / "overlays" / "eks-spot"}
SPOT = {"gke-spot": ("cloud.google.com/gke-spot", "true"),
        "eks-spot": ("eks.amazonaws.com/capacityType", "SPOT")}
STORAGE = {"base": "file", "gke-spot": "gs", "eks-spot": "s3"}


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any], docs: list[dict[str, Any]], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet would set it (secrets stay symbolic)."""
    out: dict[str, str] = {}
    for e in c.get("env", []):
        src = e.get("valueFrom", {})
        if "value" in e:
            out[e["name"]] = e["value"]
        elif "fieldRef" in src:
            assert src["fieldRef"]["fieldPath"] == "metadata.name"
            out[e["name"]] = pod_name
        elif "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            out[e["name"]] = one(docs, "ConfigMap", ref["name"])["data"][ref["key"]]
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            out[e["name"]] = f"<secret {ref['name']}/{ref['key']}>"
    return out


def parse(args: list[str], env: dict[str, str]) -> argparse.Namespace:
    """``args`` after the kubelet's $(VAR) expansion, parsed by the real ``vcasync`` parser."""
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]
    return build_parser(available_commands()).parse_args(expanded)


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(OVERLAYS[request.param])


def test_every_rendered_manifest_is_valid_for_the_named_kubernetes_version(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    assert {d["kind"] for d in docs} >= {"Namespace", "ServiceAccount", "ConfigMap", "Deployment",
                                         "StatefulSet", "Service"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises, naming the field


def test_the_validation_would_catch_a_broken_manifest(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    broken = one(docs, "StatefulSet", "vcasync-worker")
    broken = {**broken, "spec": {**broken["spec"], "replicas": "four"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nconfigMapGenerator: []\n")
    with pytest.raises(Unsupported, match="configMapGenerator"):
        render(tmp_path)


def test_the_coordinator_wiring_agrees_with_the_cli(rendered: tuple[str, list[dict[str, Any]]],
                                                    tmp_path: Path) -> None:
    name, docs = rendered
    coord = one(docs, "Deployment", "vcasync-coordinator")
    assert coord["spec"]["replicas"] == 1
    assert coord["spec"]["strategy"]["type"] == "Recreate"     # never two coordinators on one storage
    c = container(coord)
    a = parse(c["args"], env_of(c, docs, "vcasync-coordinator-x"))
    assert a.command == "coordinator"
    # run.toml reaches --config through the ConfigMap volume, and loads with the real loader.
    mount = next(m for m in c["volumeMounts"] if Path(a.config).parent == Path(m["mountPath"]))
    volume = next(v for v in coord["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    (item,) = [i for i in volume["configMap"]["items"] if i["path"] == Path(a.config).name]
    (tmp_path / "run.toml").write_text(config_map["data"][item["key"]])
    run = load_run_config(tmp_path / "run.toml")
    assert url_scheme(run.storage) == STORAGE[name]
    port = next(p for p in c["ports"] if p["name"] == "http")
    assert port["containerPort"] == run.server.port
    assert run.server.host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "healthz" in PUBLIC_ROUTES                       # the probe needs no credentials
    service = one(docs, "Service", "vcasync-coordinator")
    assert service["spec"]["selector"] == coord["spec"]["template"]["metadata"]["labels"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(run.server.port, "http")]
    assert c["resources"]["requests"]


def join_secret_ref(c: dict[str, Any]) -> tuple[str, str]:
    (e,) = [e for e in c["env"] if e["name"] == "VCASYNC_JOIN_SECRET"]
    ref = e["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_the_worker_wiring_agrees_with_the_cli(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    coord = container(one(docs, "Deployment", "vcasync-coordinator"))
    workers = one(docs, "StatefulSet", "vcasync-worker")
    w = container(workers)
    a = parse(w["args"], env_of(w, docs, "vcasync-worker-3"))
    assert a.command == "worker"
    # The coordinator's Service, by name and port.
    service = one(docs, "Service", "vcasync-coordinator")
    url = urlsplit(a.coordinator)
    assert (url.scheme, url.hostname, url.port) == ("http", service["metadata"]["name"],
                                                    service["spec"]["ports"][0]["port"])
    # The join secret: the variable both commands read, from the same Secret.
    assert 'read_secret("VCASYNC_JOIN_SECRET"' in inspect.getsource(read_join_secret)
    assert "read_join_secret(" in inspect.getsource(read_join_credential)
    assert "read_join_credential(" in inspect.getsource(worker_cmd)
    assert "read_join_secret(" in inspect.getsource(coordinator_cmd)
    assert join_secret_ref(w) == join_secret_ref(coord) == ("vcasync-join", "secret")
    # One state URL per pod, in the same storage as the run, ending in the pod's stable name.
    assert a.state is not None
    assert url_scheme(a.state) == STORAGE[name]
    assert a.state.endswith("/vcasync-worker-3")
    assert not urlsplit(a.state).query
    # SIGTERM -> the worker's grace period -> the kubelet's SIGKILL comes after, with room to spare.
    grace = workers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= a.grace_period + 5, (grace, a.grace_period)
    assert workers["spec"]["serviceName"] == one(docs, "Service", "vcasync-worker")["metadata"]["name"]
    assert w["resources"]["requests"]


def test_an_exit_is_explained_on_the_pod_and_a_long_recovery_is_not_killed(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    # found by a probe: an exit 2 (a configuration error, one line on stderr) restarted with no
    # reason on the pod (only `kubectl logs --previous` showed it), and the liveness probe (30 s
    # delay, 6 x 10 s) killed a coordinator whose journal replay took over 90 s, in a loop
    _, docs = rendered
    coord = container(one(docs, "Deployment", "vcasync-coordinator"))
    for c in (coord, container(one(docs, "StatefulSet", "vcasync-worker"))):
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError", c["name"]
    startup = coord["startupProbe"]
    assert startup["httpGet"] == coord["livenessProbe"]["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert "initialDelaySeconds" not in coord["livenessProbe"]     # the startup probe gates it


@pytest.mark.parametrize("overlay", ["gke-spot", "eks-spot"])
def test_workers_go_to_spot_capacity_and_the_coordinator_never_does(overlay: str) -> None:
    docs = render(OVERLAYS[overlay])
    key, value = SPOT[overlay]
    worker = one(docs, "StatefulSet", "vcasync-worker")["spec"]["template"]["spec"]
    assert worker["nodeSelector"] == {key: value}
    assert {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"} in worker["tolerations"]
    coord = one(docs, "Deployment", "vcasync-coordinator")["spec"]["template"]["spec"]
    assert "tolerations" not in coord
    if overlay == "gke-spot":
        terms = coord["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        expr = {"key": key, "operator": "DoesNotExist"}
        assert terms["nodeSelectorTerms"] == [{"matchExpressions": [expr]}]
    else:
        assert coord["nodeSelector"] == {key: "ON_DEMAND"}


def test_the_image_recipe_matches_the_manifests() -> None:
    dockerfile = (ROOT.parent / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["vcasync"]' in dockerfile                # manifests pass only the subcommand
    assert "ARG TORCH_INDEX=" in dockerfile                      # CPU by default, CUDA as a build arg
    user = re.search(r"^USER (\d+)", dockerfile, re.M)
    assert user is not None
    for overlay in OVERLAYS.values():
        for doc in render(overlay):
            ctx = doc.get("spec", {}).get("template", {}).get("spec", {}).get("securityContext")
            if ctx is not None:
                assert ctx["runAsUser"] == int(user.group(1))
