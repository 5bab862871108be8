"""Just enough of kustomize to render deploy/k8s, and a refusal of everything else.

No kustomize binary installs from PyPI, and the tests must run offline in CI. The manifests use only
``resources`` (files, and directories holding a kustomization), ``namespace``, ``images`` and inline
RFC 6902 JSON ``patches`` with a kind/name ``target``; this renders exactly those (the JSON patches with
the ``jsonpatch`` library) and raises on any other field, so a manifest that starts using a feature
this does not implement fails the test instead of rendering wrongly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import yaml

SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass",
                  "PriorityClass", "CustomResourceDefinition"}


class Unsupported(Exception):
    """The kustomization uses something this subset does not render."""


def render(directory: Path) -> list[dict[str, Any]]:
    """The manifests ``kubectl kustomize directory`` would print, as dicts, in order."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if spec.get("kind") != "Kustomization":
        raise Unsupported(f"{directory}: not a Kustomization")
    if extra := set(spec) - SUPPORTED:
        raise Unsupported(f"{directory}: fields {sorted(extra)} are not in the subset rendered here")
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in spec.get("patches", []):
        docs = _patch(directory, docs, patch)
    for image in spec.get("images", []):
        _set_image(docs, image)
    if ns := spec.get("namespace"):
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = ns
    return docs


def _patch(directory: Path, docs: list[dict[str, Any]], patch: dict[str, Any]) -> list[dict[str, Any]]:
    if set(patch) != {"target", "patch"} or set(patch["target"]) - {"kind", "name"}:
        raise Unsupported(f"{directory}: only inline JSON patches with a kind/name target: {patch}")
    ops = yaml.safe_load(patch["patch"])
    if not isinstance(ops, list):
        raise Unsupported(f"{directory}: strategic-merge patches are not in the subset")
    target = patch["target"]
    hits = [i for i, d in enumerate(docs)
            if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
    if len(hits) != 1:
        raise Unsupported(f"{directory}: patch target {target} matches {len(hits)} resources")
    out = list(docs)
    out[hits[0]] = jsonpatch.apply_patch(docs[hits[0]], ops)
    return out


def _set_image(docs: list[dict[str, Any]], image: dict[str, Any]) -> None:
    for doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            name = container["image"].split("@")[0].rsplit(":", 1)[0]
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
