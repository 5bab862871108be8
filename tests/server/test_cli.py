"""The ``vcasync`` command: its registry of subcommands, secrets from the environment or files only,
and configuration errors that name the problem (exit status 2)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from vcasync.cli import Command, available_commands, build_parser, main, read_secret
from vcasync.errors import ConfigError

from .conftest import coordinator_refused


def test_help_lists_the_builtin_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "coordinator" in out
    assert "worker" in out
    commands = available_commands()
    assert {"coordinator", "worker"} <= set(commands)
    assert all(isinstance(c, Command) for c in commands.values())


def test_coordinator_needs_a_join_secret(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VCASYNC_JOIN_SECRET", raising=False)
    monkeypatch.delenv("VCASYNC_JOIN_TOKENS", raising=False)
    assert main(["coordinator", "--model", "vcasync.examples.digits:model"]) == 2
    assert "VCASYNC_JOIN_SECRET" in capsys.readouterr().err


def test_coordinator_refuses_a_short_join_token_or_one_equal_to_the_secret(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    args = ["coordinator", "--model", "vcasync.examples.digits:model", "--storage", "memory://tokens"]
    monkeypatch.setenv("VCASYNC_JOIN_TOKENS", "w1=short")
    assert main(args) == 2
    assert "the join token of 'w1' is too short: use at least 16 characters" in capsys.readouterr().err
    monkeypatch.setenv("VCASYNC_JOIN_TOKENS", "w1=" + "x" * 20)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the join token of 'w1' is the join secret" in err
    assert "x" * 20 not in err


def _refused_factory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str], module: str, source: str) -> str:
    """``vcasync coordinator --model <module>:model`` with ``source`` as the module: exit 2; its
    stderr."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["coordinator", "--model", f"{module}:model", "--app-dir", str(tmp_path),
                 "--storage", f"memory://{module}", "--port", "0"]) == 2
    return capsys.readouterr().err


def test_a_non_finite_initial_model_names_its_factory_and_first_bad_tensor(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found by a tester: the refusal said "the initial model's tensor ... (--model)", not which
    # factory of which run config built it
    err = _refused_factory(monkeypatch, tmp_path, capsys, "vca_nan_factory", (
        "import torch\n"
        "def model():\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "    with torch.no_grad():\n"
        "        m[0].bias[1] = float('nan')\n"
        "        m[1].weight[0, 0] = float('inf')\n"
        "    return m\n"))
    assert ("model factory 'vca_nan_factory:model' (seed 0) built an initial model whose tensor "
            "'0.bias' is not finite (NaN or inf)") in err
    assert err.count("\n") == 1


def test_a_model_whose_dtype_no_merge_can_add_names_its_factory_and_tensor(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a float8 weight crashed the finiteness check with a raw NotImplementedError ("sum_cpu" not
    # implemented for 'Float8_e4m3fn'), exit 1 with a traceback
    err = _refused_factory(monkeypatch, tmp_path, capsys, "vca_f8_factory", (
        "import torch\n"
        "def model():\n"
        "    m = torch.nn.Linear(2, 2)\n"
        "    m.register_buffer('scale', torch.zeros(2, dtype=torch.float8_e4m3fn))\n"
        "    return m\n"))
    assert ("model factory 'vca_f8_factory:model' built a model whose tensor 'scale' has dtype "
            "torch.float8_e4m3fn, which torch cannot add or subtract on the CPU") in err
    assert err.count("\n") == 1


@pytest.mark.timeout(60)
def test_a_complex_model_names_its_factory_and_tensor(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a complex buffer was accepted, and merged by the docs' policy templates as a counter (the
    # coordinator started and served it, waiting for workers: hence the timeout)
    err = _refused_factory(monkeypatch, tmp_path, capsys, "vca_complex_factory", (
        "import torch\n"
        "def model():\n"
        "    m = torch.nn.Linear(2, 2)\n"
        "    m.register_buffer('phase', torch.zeros(2, dtype=torch.complex64))\n"
        "    return m\n"))
    assert ("model factory 'vca_complex_factory:model' built a model whose tensor 'phase' has "
            "dtype torch.complex64: ") in err
    assert "torch.view_as_real(z)" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("module", "build", "named"), [
    ("vca_sparse_factory", "m.register_buffer('adj', torch.eye(2).to_sparse())",
     "tensor 'adj' is torch.sparse_coo (not dense): pass dense tensors (.to_dense())"),
    ("vca_meta_factory", "m = m.to('meta')", "tensor 'weight' is on the meta device"),
])
def test_a_sparse_or_meta_model_names_its_factory_and_tensor(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        module: str, build: str, named: str) -> None:
    # found by a new-user probe: copying the factory's tensors crashed first (exit 1, a traceback
    # ending in torch's "unsupported memory format option Contiguous" or "Cannot copy out of meta
    # tensor"), where the docs say such a model is refused, naming it
    err = _refused_factory(monkeypatch, tmp_path, capsys, module, (
        "import torch\n"
        "def model():\n"
        "    m = torch.nn.Linear(2, 2)\n"
        f"    {build}\n"
        "    return m\n"))
    assert f"model factory '{module}:model' built a model whose {named}" in err
    assert err.count("\n") == 1


def test_a_model_factory_that_raises_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found by a new-user probe: the trainer given as the factory (it needs an argument) ended in
    # a raw TypeError traceback and exit 1, where the factory's other mistakes are exit 2
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["coordinator", "--model", "vcasync.examples.digits:train",
                 "--storage", str(tmp_path / "st"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert ("model factory 'vcasync.examples.digits:train' raised TypeError: train() missing 1 "
            "required positional argument") in err
    assert "Traceback" not in err
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1"])
def test_a_coordinator_seed_out_of_range_is_refused_like_every_seed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        seed: str) -> None:
    # found by a new-user probe: a seed past 2**64 crashed torch.manual_seed (exit 1, OverflowError),
    # -1 was taken, where `vcasync simulate` and `vcasync demo` refuse both
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["coordinator", "--model", "vcasync.examples.digits:model", "--seed", seed,
                 "--storage", str(tmp_path / "st"), "--port", "0"]) == 2
    assert f"must be in [0, 2**32), as every seed, got {seed}" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()


def test_a_non_finite_unit_param_is_refused_before_the_run_starts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found by a new-user probe: the coordinator started and every trainer got lr=nan
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["coordinator", "--model", "vcasync.examples.digits:model", "--unit-param", "lr=nan",
                 "--storage", str(tmp_path / "st"), "--port", "0"]) == 2
    assert "params.lr = nan is not finite" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()


def test_coordinator_without_a_model_factory(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["coordinator"]) == 2
    assert "no model factory" in capsys.readouterr().err


def test_a_user_module_that_fails_as_it_imports_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A trainer, model or policy module whose own code raised (or did not parse) gave a traceback and
    # exit 1: import_object caught ImportError only, though every failure is a ConfigError (exit 2)
    (tmp_path / "boom_rt.py").write_text("x = 1\nraise RuntimeError('import boom')\n")
    (tmp_path / "boom_syntax.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    worker = ["worker", "--coordinator", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "w")]
    assert main([*worker, "--trainer", "boom_rt:train"]) == 2
    err = capsys.readouterr().err
    assert "trainer 'boom_rt:train': importing 'boom_rt' raised RuntimeError: import boom" in err
    assert "boom_rt.py:2)" in err
    assert "Traceback" not in err
    assert main([*worker, "--trainer", "boom_syntax:train"]) == 2
    assert "raised SyntaxError" in (err := capsys.readouterr().err)
    assert "boom_syntax.py:1)" in err
    coord = ["coordinator", "--storage", (tmp_path / "s").as_uri(), "--port", "0"]
    assert main([*coord, "--model", "boom_rt:model"]) == 2
    assert "importing 'boom_rt' raised RuntimeError" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()                         # nothing was stored


def test_worker_needs_a_credential_and_a_trainer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VCASYNC_JOIN_SECRET", raising=False)
    monkeypatch.delenv("VCASYNC_JOIN_TOKEN", raising=False)
    args = ["worker", "--coordinator", "http://127.0.0.1:9", "--state-dir", str(tmp_path)]
    assert main([*args, "--trainer", "vcasync.examples.digits:train"]) == 2
    assert "VCASYNC_JOIN_SECRET" in capsys.readouterr().err
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main([*args, "--trainer", "no.such.module:train"]) == 2
    assert "cannot import 'no.such.module'" in capsys.readouterr().err
    assert main([*args, "--trainer", "vcasync.examples.digits"]) == 2
    assert "package.module:function" in capsys.readouterr().err
    assert main([*args, "--trainer", "vcasync.examples.digits:nope"]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
    # a secret no coordinator accepts is refused before the worker starts, as `vcasync ray up` does
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "short-secret")
    assert main([*args, "--trainer", "vcasync.examples.digits:train"]) == 2
    err = capsys.readouterr().err
    assert "the join secret (VCASYNC_JOIN_SECRET) is too short: use at least 16 characters" in err
    assert "short-secret" not in err


def test_no_flag_takes_a_secret_value() -> None:
    commands = available_commands()
    import argparse

    for cmd in commands.values():
        parser = argparse.ArgumentParser()
        cmd.configure(parser)
        flags = [s for a in parser._actions for s in a.option_strings]
        leaky = [f for f in flags if ("secret" in f or "token" in f) and not f.endswith("-file")]
        assert not leaky, f"{cmd.name}: {leaky} would put a secret in the process list"


def test_read_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("T_SECRET", "from-env")
    assert read_secret("T_SECRET", None, what="join secret") == "from-env"
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    with caplog.at_level(logging.WARNING):
        assert read_secret("T_SECRET", f, what="join secret") == "from-file"
    assert "both" in caplog.text
    assert "from-file" not in caplog.text
    assert "from-env" not in caplog.text
    f.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        read_secret("T_SECRET", f, what="join secret")
    monkeypatch.delenv("T_SECRET")
    assert read_secret("T_SECRET", None, what="join secret") is None


def test_a_secret_file_holds_its_secret_on_the_first_line(tmp_path: Path) -> None:
    # Found by a probe: the whole file was the secret. A file with a note on its second line made
    # a coordinator no worker could join (the worker holding the first line was refused, the one
    # given the file crashed on a newline in its HTTP header).
    f = tmp_path / "secret"
    f.write_text("abcdefghijklmnopqrstuvwxyz0123\n# rotated 2026-12-01 by ops\n")
    assert read_secret("T_UNSET", f, what="join secret") == "abcdefghijklmnopqrstuvwxyz0123"
    f.write_bytes(b"  abcdefghijklmnop  \r\nmore\n")
    assert read_secret("T_UNSET", f, what="join secret") == "abcdefghijklmnop"
    f.write_text("\nabcdefghijklmnop\n")
    with pytest.raises(ConfigError, match=f"the first line of the join secret file {f} is empty"):
        read_secret("T_UNSET", f, what="join secret")


@pytest.mark.parametrize("raw", [b"abcdefgh\tijklmnop\n", b"abcdefgh\rijklmnop\n", b"abcdefgh\x1bijklmnop",
                                 b"abcdefgh\x00ijklmnop"])
@pytest.mark.parametrize("what", ["join secret", "operator token", "status read token"])
def test_a_secret_with_a_control_character_is_refused_without_showing_it(
        tmp_path: Path, raw: bytes, what: str) -> None:
    f = tmp_path / "secret"
    f.write_bytes(raw)
    with pytest.raises(ConfigError) as info:
        read_secret("T_UNSET", f, what=what)
    assert f"the first line of the {what} file {f} holds a control character" in str(info.value)
    assert "ijklmnop" not in str(info.value)


@pytest.mark.parametrize("flag", ["--join-secret-file", "--operator-token-file", "--status-token-file"])
def test_coordinator_refuses_a_secret_file_with_a_control_character_before_starting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flag: str) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"abcdefgh\tijklmnopqrstuvwxyz\n")
    assert coordinator_refused(tmp_path, monkeypatch, flag, str(f)) == 2
    err = capsys.readouterr().err
    assert "configuration error: the first line of the" in err
    assert str(f) in err
    assert "ijklmnop" not in err


def test_worker_reads_its_join_secret_file_by_the_same_rule(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VCASYNC_JOIN_SECRET", raising=False)
    monkeypatch.delenv("VCASYNC_JOIN_TOKEN", raising=False)
    f = tmp_path / "secret"
    f.write_bytes(b"abcdefgh\rijklmnopqrstuvwxyz\n")
    args = ["worker", "--coordinator", "http://127.0.0.1:9", "--trainer", "no.such.module:train",
            "--state-dir", str(tmp_path / "w"), "--join-secret-file", str(f)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the first line of the join secret file {f} holds a control character" in err
    assert "ijklmnop" not in err


def test_coordinator_help_documents_storage_urls_options_and_failures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The storage options used to live only in module docstrings: an operator reading
    ``vcasync coordinator --help`` could not learn how to reach an emulator or an S3-compatible
    store, where credentials come from, or what a storage failure does to the run."""
    with pytest.raises(SystemExit) as exc:
        main(["coordinator", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("file:///", "memory://", "s3://bucket/prefix", "?endpoint_url=",
                   "gs://bucket/prefix", "?emulator_host=", "STORAGE_EMULATOR_HOST",
                   "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS",
                   "?service_file=", "503 storage_unavailable", "storage_outage_limit_s",
                   "storage_probe_interval_s", "exit status 4"):
        assert needle in text, f"{needle!r} is not in 'vcasync coordinator --help'"


def test_worker_refuses_zero_threads_and_warns_of_state_that_dies_with_it(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    # --threads 0 was taken as "not given"; --state memory:// cannot be resumed from anywhere
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    args = ["worker", "--coordinator", "http://127.0.0.1:9", "--trainer", "vcasync.examples.digits:train",
            "--state", "memory://w", "--threads", "0"]
    with caplog.at_level(logging.WARNING, logger="vcasync.cli"):
        assert main(args) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err
    assert "--state memory://w lives in this process" in caplog.text


def test_worker_refuses_more_threads_than_it_could_start_before_making_its_state(
        tmp_path: Path) -> None:
    # found by a probe: --threads 100000 was taken; the worker crashed on "can't start new thread"
    # (a traceback, exit 134), its state dir made. A process of its own: taken, that many threads
    # would be this one's
    import subprocess
    import sys

    state = tmp_path / "w"
    env = {**os.environ, "VCASYNC_JOIN_SECRET": "x" * 20}
    done = subprocess.run(
        [sys.executable, "-m", "vcasync", "worker", "--coordinator", "http://127.0.0.1:9",
         "--trainer", "vcasync.examples.digits:train", "--state-dir", str(state),
         "--give-up-after", "1", "--threads", str(max(1024, os.cpu_count() or 1) + 1)],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--threads must be at most" in done.stderr
    assert not state.exists()


@pytest.mark.parametrize(("flag", "value", "says"), [
    # found by a probe: refused by the coordinator at the join (FrameError, exit 1: "restart"),
    # and a name of bytes that are not UTF-8 by the client's encoder (a TypeError traceback)
    ("--name", "a" * 129, "name (--name) must be a string of at most 128 characters"),
    ("--name", "w\udc80", "name (--name) is not valid UTF-8"),
    # found by a probe: refused as "keep_checkpoints must be >= 1", naming no flag
    ("--keep-checkpoints", "0", "--keep-checkpoints must be >= 1, got 0"),
    ("--max-units", "-3", "--max-units must be >= 1, got -3"),
])
def test_worker_refuses_a_value_out_of_range_naming_its_flag_before_making_its_state(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flag: str, value: str, says: str) -> None:
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    state = tmp_path / "w"
    args = ["worker", "--coordinator", "http://127.0.0.1:9", "--trainer",
            "vcasync.examples.digits:train", "--state-dir", str(state), "--give-up-after", "1",
            flag, value]
    assert main(args) == 2
    assert says in capsys.readouterr().err
    assert not state.exists()


@pytest.mark.parametrize("given", [["--state-lease", "10"], ["--keep-checkpoints", "5"],
                                   ["--allow-unsafe-store"],
                                   ["--state-lease", "10", "--allow-unsafe-store"]])
def test_worker_refuses_flags_of_a_state_in_storage_beside_a_local_state_dir_alone(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        given: list[str]) -> None:
    # left alone in stop 46: dropped without a word, so a user believed a replacement would
    # resume a dead worker's lease after 10 s, or that an unsafe store had been allowed
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    state = tmp_path / "w"
    assert main(["worker", "--coordinator", "http://127.0.0.1:9", "--trainer",
                 "vcasync.examples.digits:train", "--state-dir", str(state), "--give-up-after", "1",
                 *given]) == 2
    flags = " and ".join(f for f in given if f.startswith("--"))
    assert f"{flags} only apply to a state in storage: give --state URL" in capsys.readouterr().err
    assert not state.exists()


def test_worker_refuses_a_grace_period_past_a_day(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # left alone in stop 46: --grace-period 1e300 was taken
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    state = tmp_path / "w"
    assert main(["worker", "--coordinator", "http://127.0.0.1:9", "--trainer",
                 "vcasync.examples.digits:train", "--state-dir", str(state), "--give-up-after", "1",
                 "--grace-period", "1e300"]) == 2
    assert "--grace-period must be at most 86400 seconds (a day), got 1e+300" in capsys.readouterr().err
    assert not state.exists()


def test_ray_up_refuses_a_grace_period_past_a_day_while_parsing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import vcasync.launch.ray as launch_ray

    def no_ray() -> None:
        raise AssertionError("Ray was reached with a bad --grace-period")

    monkeypatch.setattr(launch_ray, "_ray", no_ray)
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    with pytest.raises(SystemExit) as info:
        main(["ray", "--address", "127.0.0.1:1", "up", "--workers", "1", "--coordinator",
              "http://127.0.0.1:8470", "--trainer", "m:f", "--state-root", "s3://b/w",
              "--grace-period", "1e300"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]
    assert line.startswith("vcasync ray up: error: argument --grace-period: "), err
    assert "<= 86,400" in line, line


def test_an_app_dir_that_is_not_a_directory_is_refused_before_the_state_is_made(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found by a probe: a typo'd --app-dir was passed over in silence, and an installed copy of the
    # trainer (or model factory) imported instead of the project's own
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    state = tmp_path / "w"
    args = ["worker", "--coordinator", "http://127.0.0.1:9", "--trainer",
            "vcasync.examples.digits:train", "--state-dir", str(state), "--give-up-after", "1",
            "--app-dir", str(tmp_path / "no-such-dir")]
    assert main(args) == 2
    assert f"the app dir {str(tmp_path / 'no-such-dir')!r} (--app-dir) is not a directory" \
        in capsys.readouterr().err
    assert not state.exists()


#: Coordinator URLs no request can go to, and what the one check (check_coordinator_url) says.
BAD_URLS = [
    ("http://127.0.0.1:99999", "is not a valid URL: Port out of range 0-65535"),
    ("http://[::1", "is not a valid URL: Invalid IPv6 URL"),
    ("ftp://127.0.0.1:9", "must look like http(s)://host:port"),
    # found by a probe: taken, then "cannot reach the coordinator" (exit 1, as if it were down)
    ("https://a b:1", "is not a valid URL: it holds whitespace"),
    ("http://a..b:1", "'a..b' is not a host name or an IP address"),
    ("http://127.0.0.1:1/path?q", "has a query or fragment"),
    # found by a probe: taken, then aiohttp's "Cannot combine AUTHORIZATION header with ...
    # credentials encoded in URL" traceback, exit 1; the password is never echoed
    ("http://admin:hunter2pw@127.0.0.1:1", "credentials in a URL are not accepted"),
    ("https://admin:hunter2pw@[::1", "credentials in a URL are not accepted"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_worker_refuses_a_coordinator_url_no_request_can_go_to(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str,
        why: str) -> None:
    # aiohttp found the first two at the first request: an InvalidUrlClientError traceback, exit 1
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["worker", "--coordinator", url, "--trainer", "vcasync.examples.digits:train",
                 "--state-dir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "--coordinator" in err
    assert why in err
    assert "hunter2pw" not in err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(("flag", "value"), [("--grace-period", "nan"), ("--grace-period", "inf"),
                                             ("--grace-period", "0"), ("--state-lease", "nan")])
def test_worker_refuses_seconds_that_are_not_finite_and_positive(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
        value: str) -> None:
    # --grace-period nan was taken, and SIGTERM ended the worker in an asyncio traceback: "cannot
    # convert float NaN to integer". The trainer cannot be imported: what is refused first shows
    # the check comes before anything runs.
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    assert main(["worker", "--coordinator", "http://127.0.0.1:9", "--trainer", "no.such.module:train",
                 "--state-dir", str(tmp_path / "w"), flag, value]) == 2
    assert f"{flag} must be a finite number of seconds > 0, got {float(value)}" in capsys.readouterr().err


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_requeue_and_ray_up_refuse_a_coordinator_url_as_the_worker_does(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, why: str) -> None:
    # Found by a probe: requeue said "cannot reach the coordinator" (exit 1, as if it were down) for
    # a port out of range; `ray up` took any URL and started actors that each failed at their first
    # request. The worker's check (exit 2, the flag named) now guards both.
    monkeypatch.setenv("VCASYNC_OPERATOR_TOKEN", "o" * 20)
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["requeue", "--coordinator", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vcasync requeue: configuration error: --coordinator "), err
    assert why in err
    assert "hunter2pw" not in err
    pytest.importorskip("ray")
    # --address 127.0.0.1:1: had the URL passed, "no Ray cluster answers" would be the error
    assert main(["ray", "--address", "127.0.0.1:1", "up", "--workers", "1", "--coordinator", url,
                 "--trainer", "m:f", "--state-root", "s3://b/w"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vcasync ray: configuration error: --coordinator "), err
    assert why in err


@pytest.mark.parametrize("value", ["2.9", "0", "-5", "nan", "inf", "-inf", "soon"])
def test_ray_up_refuses_a_bad_state_lease_while_parsing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str) -> None:
    # Found by review: `ray up --state-lease 1` (or nan) was taken, the fleet started, and every
    # actor's worker then refused it (the worker's floor is the owner lease's 3 s). Now argparse
    # refuses it, the flag named, before Ray is imported or connected to.
    import vcasync.launch.ray as launch_ray

    def no_ray() -> None:
        raise AssertionError("Ray was reached with a bad --state-lease")

    monkeypatch.setattr(launch_ray, "_ray", no_ray)
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    with pytest.raises(SystemExit) as info:
        main(["ray", "--address", "127.0.0.1:1", "up", "--workers", "1",
              "--coordinator", "http://127.0.0.1:8470", "--trainer", "m:f", "--state-root", "s3://b/w",
              f"--state-lease={value}"])     # "=": argparse takes "-inf" alone for an option
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]
    assert line.startswith("vcasync ray up: error: argument --state-lease: "), err
    assert value in line
    if value != "soon":
        assert "must be a finite number of seconds >= 3" in line


def test_ray_up_takes_a_state_lease_at_the_floor() -> None:

    argv = ["ray", "up", "--workers", "1", "--coordinator", "http://127.0.0.1:8470", "--trainer", "m:f",
            "--state-root", "s3://b/w"]
    parser = build_parser(available_commands())
    assert parser.parse_args([*argv, "--state-lease", "3"]).state_lease == 3.0
    assert parser.parse_args(argv).state_lease == 30.0


def test_requeue_refuses_an_empty_unit_id_as_configuration(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Found by a probe: --unit "" was a FrameError from the client, exit 1 ("restart")
    monkeypatch.setenv("VCASYNC_OPERATOR_TOKEN", "o" * 20)
    assert main(["requeue", "--coordinator", "http://127.0.0.1:9", "--unit", ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vcasync requeue: configuration error: --unit: field 'units' must be"), err


def test_requeue_against_a_coordinator_that_is_not_there_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.fleet import free_port

    monkeypatch.setenv("VCASYNC_OPERATOR_TOKEN", "o" * 20)
    url = f"http://127.0.0.1:{free_port()}"       # nothing listens there
    assert main(["requeue", "--coordinator", url]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the coordinator at {url}" in err
    assert "nothing was requeued" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("unit", "why"), [("e0-s0", "unit 'e0-s0' is queued, not parked"),
                                         ("e9-s9", "no work unit 'e9-s9'")])
async def test_requeue_of_a_unit_that_is_not_parked_is_the_operators_to_fix(
        tmp_path: Path, unit: str, why: str) -> None:
    # found by a probe: "vcasync requeue --unit e0-s0" for a unit not parked (or a typo) exited 1,
    # which operating.md reads as "restart: the run resumes"; no retry mends the unit named
    import asyncio
    import subprocess
    import sys

    from vcasync.server._auth import TokenAuthority

    from .conftest import SECRET, running

    operator = "operator-token-for-tests-1d2e"
    async with running(tmp_path, authority=TokenAuthority(join_secret=SECRET,
                                                          operator_token=operator)) as (coord, server):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vcasync", "requeue", "--coordinator", server.url, "--unit", unit,
            env={**os.environ, "VCASYNC_OPERATOR_TOKEN": operator},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert coord.status()["units"]["queued"] == 4            # nothing changed
    text = err.decode()
    assert proc.returncode == 2, text
    assert why in text
    assert "nothing was requeued" in text
    assert "only parked units" in text
    assert "Traceback" not in text
    assert out == b""


@pytest.mark.parametrize("command", ["worker", "requeue"])
def test_a_url_where_another_server_answers_is_said_to_be_no_coordinator(
        tmp_path: Path, command: str) -> None:
    # found by a probe: --coordinator at a port where another web server answers (501, an HTML
    # page) ended the worker on an aiohttp traceback holding that page (exit 1), and requeue on
    # "cannot reach the coordinator: 501, message='<!DOCTYPE HTML>..." (exit 1)
    import http.server
    import subprocess
    import sys
    import threading

    class Other(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_error(501, "Unsupported method ('POST')")

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{other.server_address[1]}"
    env = {**os.environ, "VCASYNC_JOIN_SECRET": "x" * 20, "VCASYNC_OPERATOR_TOKEN": "o" * 20}
    args = (["worker", "--trainer", "vcasync.examples.digits:train", "--state-dir",
             str(tmp_path / "w"), "--give-up-after", "5"] if command == "worker" else ["requeue"])
    try:
        done = subprocess.run([sys.executable, "-m", "vcasync", *args, "--coordinator", url],
                              env=env, capture_output=True, text=True, timeout=120)
    finally:
        other.shutdown()
        other.server_close()
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"at {url} was answered HTTP 501 (text/html) without a vcasync error body" in done.stderr
    assert "is not a vcasync coordinator" in done.stderr
    assert "Traceback" not in done.stderr
    assert "DOCTYPE" not in done.stderr


def test_coordinator_refuses_an_output_it_could_not_write_and_an_unknown_storage_scheme(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Both were found only late: the output when the run finished (after all of it), the scheme
    # as an "unexpected error" (exit 1) instead of a configuration one
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    base = ["coordinator", "--model", "vcasync.examples.digits:model", "--port", "0"]
    store = ["--storage", str(tmp_path / "store")]
    assert main([*base, *store, "--output", str(tmp_path / "missing" / "w.pt")]) == 2
    assert f"the directory {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert main([*base, *store, "--output", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()          # refused before anything was made
    assert main([*base, "--storage", "zzz://bucket"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: no storage backend for the URL scheme 'zzz'" in err


def test_main_called_in_process_gives_the_signals_back_as_it_found_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The coordinator's event loop (uvloop) left its own SIGINT and SIGTERM handlers installed
    # after it closed, handlers of a closed loop that do nothing: a program that had called
    # main(["coordinator", ...]) no longer stopped on Ctrl-C (plain asyncio put the defaults back,
    # not what was there).
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["coordinator", "--model", "vcasync.examples.digits:model", "--port", "0",
                     "--storage", "zzz://bucket"]) == 2          # fails once its loop runs
        assert "no storage backend for the URL scheme 'zzz'" in capsys.readouterr().err
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)               # Ctrl-C stops the program again
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def test_coordinator_refuses_a_port_file_it_could_not_write_before_serving(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a missing directory was found once serving: a FileNotFoundError traceback, exit status 1
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    base = ["coordinator", "--model", "vcasync.examples.digits:model", "--port", "0",
            "--storage", str(tmp_path / "store")]
    assert main([*base, "--port-file", str(tmp_path / "missing" / "port")]) == 2
    err = capsys.readouterr().err
    assert f"--port-file: the directory {tmp_path / 'missing'} does not exist (the coordinator's URL " \
           f"is written to {tmp_path / 'missing' / 'port'} once it listens)" in err
    assert "Traceback" not in err
    assert main([*base, "--port-file", str(tmp_path)]) == 2
    assert f"--port-file {tmp_path} is a directory" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()          # refused before anything was made


@pytest.mark.parametrize("linger", ["nan", "-5", "inf"])
def test_coordinator_refuses_a_linger_that_is_negative_or_not_finite_before_starting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        linger: str) -> None:
    # --linger -5 and nan were taken, and logged when the run finished: "serving nans more". The
    # model cannot be imported: what is refused first shows the check comes before anything runs.
    assert coordinator_refused(tmp_path, monkeypatch, "--linger", linger) == 2
    err = capsys.readouterr().err
    assert f"run.linger_s (--linger) must be a finite number of seconds >= 0, got {float(linger)!r}" in err


@pytest.mark.parametrize(("flag", "key", "value"), [("--shards", "shards", "-1"), ("--epochs", "epochs", "0"),
                                                   ("--steps", "steps", "0"), ("--units", "count", "0")])
def test_coordinator_refuses_a_unit_count_below_one_naming_its_flag(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flag: str, key: str, value: str) -> None:
    # found by a probe: --shards -1 said "work unit field 'num_shards' must be >= 1", naming neither
    # the flag nor the run.toml key
    assert coordinator_refused(tmp_path, monkeypatch, flag, value) == 2
    assert f"units.{key} ({flag}) must be a whole number >= 1, got {int(value)}" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "key"), [("--shards", "shards"), ("--epochs", "epochs"),
                                         ("--steps", "steps"), ("--units", "count")])
def test_coordinator_refuses_a_unit_count_no_result_can_carry_naming_its_flag(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flag: str, key: str) -> None:
    # found by a probe: --steps 100000000000000000000 was taken, wrote the run record, then the first
    # snapshot crashed (TypeError traceback, exit 1), and the corrected start was refused as
    # "does not match" the run that crash left
    value = 2**63
    assert coordinator_refused(tmp_path, monkeypatch, flag, str(value)) == 2
    assert f"units.{key} ({flag}) must be at most 2**63 - 1" in capsys.readouterr().err


def test_a_work_unit_holds_no_count_a_result_cannot_carry() -> None:
    from vcasync.ledger import make_units
    from vcasync.ledger._units import WorkUnit

    assert make_units(1, steps=2**63 - 1)[0].steps == 2**63 - 1
    for field in ("steps", "epoch", "num_shards"):
        with pytest.raises(ConfigError, match=f"'{field}' must be at most 2\\*\\*63 - 1"):
            WorkUnit("u", **{field: 2**63})


@pytest.mark.parametrize(("flag", "value"), [("--unit-param", "lr=0.1.2"), ("--unit-param", "lr=["),
                                            ("--policy-param", 'alpha="0.5')])
def test_coordinator_refuses_a_param_that_is_neither_a_value_nor_a_bare_word_before_starting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flag: str, value: str) -> None:
    # Found by a probe: --unit-param lr=0.1.2 became the string '0.1.2', the coordinator started,
    # and every worker's trainer failed every unit on it ("unit param 'lr' must be a number").
    assert coordinator_refused(tmp_path, monkeypatch, flag, value) == 2
    key, _, raw = value.partition("=")
    assert f"{flag} {key}: {raw!r} is not a valid value" in capsys.readouterr().err


def test_a_bare_word_param_is_still_a_string(monkeypatch: pytest.MonkeyPatch) -> None:
    from vcasync.commands.coordinator import _kv

    items = ["workload=digits", "lr=0.5", "name=\"x\"", "fn=pkg.mod:fn", "path=/tmp/x"]
    assert _kv(items, "--unit-param") == {"workload": "digits", "lr": 0.5, "name": "x", "fn": "pkg.mod:fn",
                                          "path": "/tmp/x"}


def test_coordinator_refuses_a_heartbeat_slower_than_the_lease_timeout_before_starting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # lease timeout 4 s, heartbeat 50 s: each lease expired before its first heartbeat, and the
    # unit was leased to another worker and trained twice
    assert coordinator_refused(tmp_path, monkeypatch,
                               toml="[coordinator]\nlease_timeout_s = 4\nheartbeat_interval_s = 50\n") == 2
    err = capsys.readouterr().err
    assert "heartbeat_interval_s must be at most a third of lease_timeout_s (1.33333 s)" in err


def test_coordinator_on_a_port_in_use_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["coordinator", "--model", "vcasync.examples.digits:model", "--port", str(port),
                     "--storage", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "address already in use" in err


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "https://127.0.0.1:9"])
def test_a_ca_file_that_is_not_there_is_refused_by_worker_and_requeue(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        url: str) -> None:
    # found by a new-user probe: --ca-file /nonexistent was ignored without a word for http://
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    monkeypatch.setenv("VCASYNC_OPERATOR_TOKEN", "y" * 20)
    missing = str(tmp_path / "nonexistent.pem")
    assert main(["worker", "--coordinator", url, "--state-dir", str(tmp_path / "s"),
                 "--trainer", "vcasync.examples.digits:train", "--ca-file", missing]) == 2
    assert f"--ca-file {missing!r} does not exist" in capsys.readouterr().err
    assert main(["requeue", "--coordinator", url, "--ca-file", missing]) == 2
    assert f"--ca-file {missing!r} does not exist" in capsys.readouterr().err


def test_a_ca_file_with_a_plain_http_coordinator_is_said_to_have_no_effect(tmp_path: Path) -> None:
    from vcasync._paths import check_ca_file

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert "has no effect: the coordinator URL is plain HTTP" in str(check_ca_file(ca, "http://h:8000"))
    assert check_ca_file(ca, "https://h:8000") is None
    assert check_ca_file(None, "http://h:8000") is None
    with pytest.raises(ConfigError, match="is a directory"):
        check_ca_file(tmp_path, "https://h:8000")


class _SignalWhileStarting:
    """Chaos-style hooks that SIGTERM this process while the coordinator opens its storage (the
    policy is wrapped there, inside the storage's ``async with``)."""

    def wrap_policy(self, policy: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return policy

    def wrap_storage(self, storage: Any, state_prefix: str) -> Any:
        return storage


def test_a_coordinator_signalled_while_it_opens_its_storage_closes_it_without_serving(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Exit 130 (stopped before the run finished), nothing served, and the storage closed as after
    serving: the owner lease is handed back, so the next start is not told to wait for workers of a
    coordinator that stopped uncleanly."""
    from vcasync.commands import coordinator

    caplog.set_level(logging.INFO, "vcasync")
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    argv = ["coordinator", "--model", "vcasync.examples.digits:model", "--units", "2", "--port", "0",
            "--storage", str(tmp_path / "store"), "--port-file", str(tmp_path / "url"), "--linger", "0"]
    args = build_parser({"coordinator": coordinator.COMMAND}).parse_args(argv)
    assert coordinator.launch(args, hooks=_SignalWhileStarting()) == 130
    assert "stopped while starting, at model v0: not served" in caplog.text
    assert "listening" not in caplog.text
    assert not (tmp_path / "url").exists()
    caplog.clear()
    args = build_parser({"coordinator": coordinator.COMMAND}).parse_args(argv)
    assert coordinator.launch(args, hooks=_SignalWhileStarting()) == 130
    assert "stopped uncleanly" not in caplog.text         # the first start's owner lease was let go


class _LookAtThePortFileWhileStarting(_SignalWhileStarting):
    """Notes whether the port file exists when the coordinator opens its storage, then stops it."""

    def __init__(self, port_file: Path) -> None:
        self.port_file = port_file
        self.seen: list[str | None] = []

    def wrap_storage(self, storage: Any, state_prefix: str) -> Any:
        self.seen.append(self.port_file.read_text() if self.port_file.exists() else None)
        return storage


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_port_file_a_killed_coordinator_left_is_gone_before_the_restart_opens_its_storage(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a SIGKILLed coordinator cannot remove its --port-file: the dead URL stayed until the restart
    # was listening (~2 s later), and a script waiting for the file read the old URL
    from vcasync.commands import coordinator

    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    port_file = tmp_path / "url"
    port_file.write_text(f"http://127.0.0.1:{_closed_port()}\n")     # nothing listens there
    argv = ["coordinator", "--model", "vcasync.examples.digits:model", "--units", "2", "--port", "0",
            "--storage", str(tmp_path / "store"), "--port-file", str(port_file), "--linger", "0"]
    hooks = _LookAtThePortFileWhileStarting(port_file)
    args = build_parser({"coordinator": coordinator.COMMAND}).parse_args(argv)
    assert coordinator.launch(args, hooks=hooks) == 130
    assert hooks.seen == [None]


def test_a_port_file_where_a_coordinator_still_listens_is_left_to_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a second start (to be refused: the run is in use) must not take the live one's file away
    import socket

    from vcasync.commands import coordinator

    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    port_file = tmp_path / "url"
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        url = f"http://127.0.0.1:{live.getsockname()[1]}\n"
        port_file.write_text(url)
        argv = ["coordinator", "--model", "vcasync.examples.digits:model", "--units", "2",
                "--port", "0", "--storage", str(tmp_path / "store"), "--port-file", str(port_file),
                "--linger", "0"]
        hooks = _LookAtThePortFileWhileStarting(port_file)
        args = build_parser({"coordinator": coordinator.COMMAND}).parse_args(argv)
        assert coordinator.launch(args, hooks=hooks) == 130
    assert hooks.seen == [url]
    assert port_file.read_text() == url                 # it never listened: nothing of it to remove


def test_a_port_file_that_holds_no_url_is_never_removed_nor_logged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # found by a probe: --port-file pointed at another file by mistake deleted it at start-up, even
    # when the start was then refused, and logged what it held ("it held precious notes ..."); and
    # (a third probe) a start that went on replaced it once listening and removed it at the stop
    from vcasync.commands import coordinator

    caplog.set_level("INFO")
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    notes = tmp_path / "notes.txt"
    notes.write_text("precious notes\nline 2\n")
    argv = ["coordinator", "--model", "no_such_module:fn", "--port", "0", "--epochs", "-3",
            "--storage", str(tmp_path / "store"), "--port-file", str(notes)]
    args = build_parser({"coordinator": coordinator.COMMAND}).parse_args(argv)
    with pytest.raises(ConfigError, match=r"--port-file .* holds something other than a URL"):
        coordinator.launch(args)                           # refused (exit 2), first
    assert notes.read_text() == "precious notes\nline 2\n"
    assert "precious" not in caplog.text
