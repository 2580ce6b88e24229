"""A minimal ``kustomize build`` for the features deploy/k8s uses, so that the manifests can be
built and validated without kubectl: resources (files and kustomization folders), namespace,
labels (metadata only), images, and JSON 6902 patches aimed at a kind and name.

Any other field is an error rather than silently ignored. Where kubectl is installed, a test
checks that this builds exactly what ``kubectl kustomize`` builds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
CLUSTER_SCOPED = {"Namespace"}

Manifest = dict[str, Any]


def build(directory: Path) -> list[Manifest]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - FIELDS
    if unsupported:
        raise ValueError(f"{directory}: {sorted(unsupported)} not supported by tests/deploy/kustomize.py")
    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        manifests += build(path) if path.is_dir() else [m for m in yaml.safe_load_all(path.read_text()) if m]
    for patch in kustomization.get("patches", []):
        _apply_patch(directory, patch, manifests)
    for image in kustomization.get("images", []):
        _set_image(image, manifests)
    for label_set in kustomization.get("labels", []):
        if set(label_set) != {"pairs"}:
            raise ValueError(f"{directory}: labels support only `pairs` (metadata labels)")
        for manifest in manifests:
            manifest["metadata"].setdefault("labels", {}).update(label_set["pairs"])
    if "namespace" in kustomization:
        for manifest in manifests:
            if manifest["kind"] not in CLUSTER_SCOPED:
                manifest["metadata"]["namespace"] = kustomization["namespace"]
    return manifests


def _apply_patch(directory: Path, patch: dict[str, Any], manifests: list[Manifest]) -> None:
    if set(patch) != {"path", "target"} or set(patch["target"]) - {"kind", "name"}:
        raise ValueError(f"{directory}: patches need `path` and a `target` of kind and name")
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    target = patch["target"]
    targets = [
        m
        for m in manifests
        if m["kind"] == target.get("kind", m["kind"])
        and m["metadata"]["name"] == target.get("name", m["metadata"]["name"])
    ]
    if not targets:
        raise ValueError(f"{directory}: patch {patch['path']} matches nothing")
    for manifest in targets:
        for operation in operations:
            _json_patch(manifest, operation)


def _json_patch(document: Any, operation: dict[str, Any]) -> None:
    """One RFC 6902 operation: add, replace or remove."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
    for part in parents:
        document = document[int(part)] if isinstance(document, list) else document[part]
    key: Any = int(last) if isinstance(document, list) and last != "-" else last
    op = operation["op"]
    if op == "add" and isinstance(document, list):
        document.insert(len(document) if key == "-" else key, operation["value"])
    elif op == "add" or (op == "replace" and key in (range(len(document)) if isinstance(document, list) else document)):
        document[key] = operation["value"]
    elif op == "remove":
        del document[key]
    else:
        raise ValueError(f"cannot {op} {operation['path']}")


def _set_image(image: dict[str, str], manifests: list[Manifest]) -> None:
    for manifest in manifests:
        pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            name, tag = _split_tag(container["image"])
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def _split_tag(reference: str) -> tuple[str, str]:
    """'registry:5000/name:tag' -> ('registry:5000/name', 'tag')."""
    name, colon, tag = reference.rpartition(":")
    return (name, tag) if colon and "/" not in tag else (reference, "")
