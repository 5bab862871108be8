"""vcasync.launch.ray on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head and three
spot worker nodes as separate raylets) inside a loopback-only network namespace: a worker's node is
removed mid-unit without notice and a new node added; Ray restarts the actor there, it resumes the same
lease from its checkpoint in remote state, scaling down and up mid-run loses nothing, and the run ends
with every unit merged exactly once. And the example autoscaler configs pass Ray's own validation."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster_scenario import UNITS

CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "ray"


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_example_autoscaler_configs_pass_rays_validation(cloud: str) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CONFIGS / f"cluster-{cloud}.yaml").read_text())
    prepared = prepare_config(config)     # what `ray up` does before it validates: defaults merged
    validate_config(prepared)             # Ray's JSON schema and its own checks; raises if invalid
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert "spot" not in head.get("resources", {})               # the coordinator's node is on-demand
    spot_types = [t for name, t in types.items() if name != prepared["head_node_type"]]
    assert spot_types
    for t in spot_types:
        assert t["resources"]["spot"] >= 1                      # what RayWorkerSpec.spot_resource asks for
        node = t["node_config"]
        if cloud == "aws":
            assert node["InstanceMarketOptions"]["MarketType"] == "spot"
        else:
            assert node["scheduling"]["provisioningModel"] == "SPOT"


def test_rays_validation_catches_a_broken_config() -> None:
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CONFIGS / "cluster-aws.yaml").read_text())
    config["available_node_types"]["spot_cpu"]["min_worker"] = 1   # a typo of min_workers
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


def test_the_clusters_run_toml_loads() -> None:
    from vcasync.runconfig import load_run_config

    assert load_run_config(CONFIGS / "run.toml").storage.startswith("s3://")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a loopback-only network namespace needs root and unshare (CI has both)")
def test_a_preempted_nodes_worker_resumes_on_a_new_node(
        tmp_path: Path, run_scenario: Callable[[str, Path], dict[str, Any]]) -> None:
    r = run_scenario("cluster_scenario.py", tmp_path)
    assert r["node_addresses"] == ["127.0.0.1"]                  # nothing but loopback
    assert r["scaled_up"] == [0, 1, 2]
    assert len(set(r["first_nodes"].values())) == 3              # one worker per spot node
    assert set(r["first_nodes"].values()) <= set(r["spot_nodes"])
    # The preempted worker came back on the new node, and picked its lease up from its checkpoint.
    assert r["restarted"] is True
    assert r["restarted_node"] == r["new_node"]
    log0 = "\n".join(r["logs"]["0"])
    lease = r["killed_lease"]
    assert f"resumed lease {lease}" in log0, log0[-3000:]
    (start,) = [int(s) for s in re.findall(rf"lease {re.escape(lease)} starts at step (\d+)", log0)]
    assert start > 0
    # Scaled down and up mid-run; the run finished; every unit merged exactly once (one version each).
    assert (r["scaled_down"], r["scaled_up_again"]) == ([0, 1], [0, 1, 2])
    assert [(st["index"], st["state"] != "unavailable") for st in r["cli_status"]] == [
        (0, True), (1, True), (2, True)]
    assert {s["state"] for s in r["final"].values()} == {"finished"}, r["final"]
    assert r["version"] == UNITS
    assert r["after_down"] == []
    assert r["coordinator_exit"] == 0


def test_actor_options_place_workers_on_spot_and_keep_the_secret_out_of_the_spec() -> None:
    from vcasync.errors import ConfigError
    from vcasync.launch.ray import RayWorkerSpec, actor_options

    spec = RayWorkerSpec(coordinator="http://c:8470", trainer="m:f", state_root="s3://b/w",
                         spot_labels={"ray.io/market-type": "spot"}, num_cpus=4)
    opts = actor_options(spec, 7, {"VCASYNC_JOIN_SECRET": "s3cret", "HOME": "/root"})
    assert opts["name"] == "vcasync-worker-7"
    assert (opts["lifetime"], opts["max_restarts"]) == ("detached", -1)
    assert opts["resources"] == {"spot": 0.001}
    assert opts["label_selector"] == {"ray.io/market-type": "spot"}
    assert opts["runtime_env"] == {"env_vars": {"VCASYNC_JOIN_SECRET": "s3cret"}}
    assert "s3cret" not in json.dumps(spec.to_dict())
    assert RayWorkerSpec.from_dict(spec.to_dict()) == spec
    assert spec.state_url(7) == "s3://b/w/worker-7"
    # found by a tester: NaN passed the `grace_period_s <= 0` check (as it did WorkerConfig's)
    where = {"coordinator": "http://c", "trainer": "m:f", "state_root": "s3://b/w"}
    with pytest.raises(ConfigError, match="grace_period_s must be a finite number > 0, got nan"):
        RayWorkerSpec(**where, grace_period_s=float("nan"))
    with pytest.raises(ConfigError, match="num_cpus and num_gpus must be >= 0"):
        RayWorkerSpec(**where, num_gpus=float("nan"))
    # found by a probe: every actor of a spec with a bad coordinator URL failed at its first call
    with pytest.raises(ConfigError, match=r"coordinator 'http://c:99999' is not a valid URL"):
        RayWorkerSpec(**{**where, "coordinator": "http://c:99999"})


_WHERE = {"coordinator": "http://c:8470", "trainer": "m:f"}


def test_state_urls_keep_the_query_and_relative_paths_are_refused() -> None:
    from vcasync.errors import ConfigError
    from vcasync.launch.ray import RayWorkerSpec

    # found by a tester: '?endpoint_url=...' was refused though storage options go in the URL query
    spec = RayWorkerSpec(**_WHERE, state_root="s3://b/p?endpoint_url=http://127.0.0.1:9000&region=x")
    assert spec.state_url(3) == "s3://b/p/worker-3?endpoint_url=http://127.0.0.1:9000&region=x"
    assert RayWorkerSpec(**_WHERE, state_root="/abs/dir").state_url(0) == "/abs/dir/worker-0"
    assert RayWorkerSpec(**_WHERE, state_root="file://localhost/abs").state_url(1) == "file://localhost/abs/worker-1"
    assert RayWorkerSpec(**_WHERE, state_root="file:///a?durable=false").state_url(0) == (
        "file:///a/worker-0?durable=false")
    # found by a tester: a relative path resolved in each actor's own working directory
    for relative in ("relstate", "./relstate", "~/state", "file:relstate"):
        with pytest.raises(ConfigError, match="is a relative path"):
            RayWorkerSpec(**_WHERE, state_root=relative)
    for bad in ("s3://b/p/", "s3://b/p/?region=x"):
        with pytest.raises(ConfigError, match="must not end with '/'"):
            RayWorkerSpec(**_WHERE, state_root=bad)
    with pytest.raises(ConfigError, match="fragment"):
        RayWorkerSpec(**_WHERE, state_root="s3://b/p#x")
    # found by a probe: memory:// was accepted, and a restarted actor retrained its unit from step 0
    for in_memory in ("memory://fleet", "MEMORY://fleet"):
        with pytest.raises(ConfigError, match=rf"state_root '{in_memory}' lives in the memory of the "
                                              "process that opens it: .* from step 0"):
            RayWorkerSpec(**_WHERE, state_root=in_memory)



@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a loopback-only network namespace needs root and unshare (CI has both)")
def test_the_command_ends_and_explains_when_workers_die_or_cannot_be_placed(
        tmp_path: Path, run_scenario: Callable[[str, Path], dict[str, Any]]) -> None:
    # found by a tester: `up --wait` hung on a dead fleet; status and down hung on a pending actor; a
    # second `up` with another spec silently mixed two fleets
    r = run_scenario("cli_scenario.py", tmp_path)
    bad = r["bad"]
    assert bad["rc"] == 1, bad
    assert bad["lines"][-1]["state"] == "dead", bad
    assert "nonexistent" in bad["lines"][-1]["error"], bad
    dead = r["dead_up"]
    assert dead["rc"] == 1, dead
    assert dead["lines"][0] == {"running": [0]}, dead
    assert (dead["lines"][-1]["state"], dead["lines"][-1]["index"]) == ("dead", 0), dead
    assert "nonexistent" in dead["lines"][-1]["error"], dead
    assert "worker(s) [0] died as they started" in dead["err"], dead
    (st,) = r["dead_status"]["lines"]
    assert (r["dead_status"]["rc"], st["state"]) == (0, "dead"), r["dead_status"]
    assert "nonexistent" in st["error"], st
    assert (r["dead_down"]["rc"], r["dead_down"]["lines"]) == (0, [{"stopped": [0]}]), r["dead_down"]
    assert r["dead_after_down"]["rc"] == 2, r["dead_after_down"]
    assert "no vcasync workers in the Ray namespace 'dead'" in r["dead_after_down"]["err"]
    up = r["pending_up"]
    assert (up["rc"], up["lines"]) == (0, [{"running": [0]}]), up
    assert "warning: Ray cannot place the workers: needs resource 'spot', which no alive node has" in (
        up["err"])
    (st,) = r["pending_status"]["lines"]
    assert (r["pending_status"]["rc"], st["state"]) == (0, "pending"), r["pending_status"]
    assert st["error"] == "cannot be placed: needs resource 'spot', which no alive node has"
    assert r["pending_status"]["s"] < 30
    other = r["other_spec"]
    assert other["rc"] == 2, other
    assert "coordinator: running 'http://127.0.0.1:9', asked 'http://127.0.0.1:9999'" in other["err"]
    assert "state_root: running" in other["err"]
    assert "'vcasync ray down' first" in other["err"]
    assert (r["down"]["rc"], r["down"]["lines"]) == (0, [{"stopped": [0]}]), r["down"]
    assert r["down"]["s"] < 30
    assert r["after_down"]["rc"] == 2
    assert "no vcasync workers in the Ray namespace 'pend'" in r["after_down"]["err"]


_NEEDS_NETNS = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a loopback-only network namespace needs root and unshare (CI has both)")


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory: pytest.TempPathFactory,
                run_scenario: Callable[[str, Path], dict[str, Any]]) -> dict[str, Any]:
    """sigterm_scenario.py's account of a worker actor SIGTERMed mid-unit (run once for the file)."""
    return run_scenario("sigterm_scenario.py", tmp_path_factory.mktemp("sigterm"))


@pytest.mark.slow
@_NEEDS_NETNS
def test_a_sigterm_to_a_worker_actor_keeps_its_lease_for_the_restarted_actor(
        sigterm_run: dict[str, Any]) -> None:
    # found by a probe: the actor's process exited under its worker, the trainer failed on the
    # interpreter's shutdown ("cannot schedule new futures after shutdown"), the worker reported it
    # to the coordinator, which released the lease, and the restarted actor trained the unit anew
    r = sigterm_run
    coord_log = "\n".join(r["coordinator_log"])
    assert "left (error" not in coord_log, coord_log[-3000:]
    assert "left (preempted)" in coord_log, coord_log[-3000:]     # it stopped as told, not died
    log0 = "\n".join(r["log"])
    # its state released as it stopped: a replacement on another node does not wait out the state lease
    assert "is gone (its process no longer runs)" not in log0, log0[-3000:]
    lease = r["terminated_lease"]
    assert r["final"]["0"] == {"state": "finished", "restarted": True, "error": None}, r["final"]
    assert f"resumed lease {lease}" in log0, log0[-3000:]
    (start,) = [int(s) for s in re.findall(rf"lease {re.escape(lease)} starts at step (\d+)", log0)]
    assert start > 0
    assert r["version"] == 2                      # both units merged, each once
    assert r["coordinator_exit"] == 0


@pytest.mark.slow
@_NEEDS_NETNS
def test_worker_actors_leave_no_local_cache_behind(sigterm_run: dict[str, Any]) -> None:
    # found by a probe: each actor incarnation's $TMPDIR/vcasync-worker-<i>-* (models, checkpoints,
    # identity.json with the worker's token) stayed after its worker finished, stopped or failed
    assert sigterm_run["final"]["0"]["state"] == "finished"
    assert sigterm_run["left_in_tmp"] == []
