"""The conventions users expect of ``provision`` (issue 18): --version, ``python -m provisioner``,
global flags anywhere on the line, one rule for trace paths, ``--json`` that is always JSON,
Ctrl-C and closed pipes ending quietly, completion, and missing cloud SDKs named by extra.

The pipe and Ctrl-C checks run the real console program in a subprocess on a real trace: a
closed pipe or a SIGINT only behaves as users see it in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner import clio
from provisioner.cli import build_parser, main, sub_parser

REPO = Path(__file__).resolve().parents[3]
PROVISION = [sys.executable, "-m", "provisioner"]

#: The fewest arguments each command parses with (placeholders are never opened).
MINIMAL = {"prices": [], "plan": [], "simulate": ["--trace", "t", "--work", "1"], "run": [],
           "check": [], "status": [], "list": [], "logs": [], "stop": [], "down": [],
           "revoke": ["i-1"],
           "completion": ["bash"]}


def parse(argv: list[str]) -> argparse.Namespace:
    return clio.merge_global_flags(build_parser().parse_args(argv))


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return {name: sub_parser(parser, name) for name in MINIMAL}


def test_every_command_is_covered_here():
    from provisioner.commands import COMMANDS

    assert set(COMMANDS) == set(MINIMAL)


def test_version_and_python_dash_m():
    out = subprocess.run([*PROVISION, "--version"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.startswith("python -m provisioner (spotring) ")
    from provisioner.cli import version

    assert out.stdout.split()[-1] == version() != ""
    helped = subprocess.run([*PROVISION, "--help"], capture_output=True, text=True, cwd=REPO)
    assert helped.returncode == 0 and "usage: python -m provisioner" in helped.stdout
    for name in MINIMAL:
        assert f"\n  {name} " in helped.stdout


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_global_flags_anywhere_on_the_line(name):
    rest = MINIMAL[name]
    for argv in (["-v", "--log-level", "error", name, *rest],
                 [name, *rest, "-v", "--log-level", "error"],
                 ["-v", name, *rest, "--log-level", "ERROR"]):
        args = parse(argv)
        assert args.command == name and args.verbose == 1 and args.log_level == "ERROR", argv
        assert clio.log_level(args) == 40
    assert parse(["-v", name, *rest, "-v"]).verbose == 2  # counts add up across the command
    assert parse([name, *rest]).verbose == 0 and parse([name, *rest]).log_level is None
    assert clio.log_level(parse(["-vv", name, *rest])) == 10


@pytest.mark.parametrize("name", sorted(n for n, p in commands().items() if clio.has_json_flag(p)))
def test_json_before_or_after_the_command(name):
    rest = MINIMAL[name]
    assert parse(["--json", name, *rest]).json is True
    assert parse([name, *rest, "--json"]).json is True
    assert parse([name, *rest]).json is False


def test_json_flag_is_declared_by_the_commands_that_print_json():
    have = {n for n, p in commands().items() if clio.has_json_flag(p)}
    assert have == {"prices", "plan", "simulate", "check", "status", "list", "down"}


def test_json_on_a_command_without_json_output_is_a_usage_error(capsys):
    assert main(["--json", "revoke", "i-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["provision revoke: error: --json: this command has no JSON output"]


@pytest.mark.parametrize("name", sorted(n for n, p in commands().items()
                                        if "--trace" in p._option_string_actions))
def test_trace_paths_one_rule_for_every_command(name):
    rest = [a for a in MINIMAL[name] if a not in ("--trace", "t")]
    args = parse([name, *rest, "--trace", "a", "b", "--trace", "c"])
    assert args.trace == ["a", "b", "c"]


def test_the_commands_taking_traces_are_the_expected_ones():
    have = {n for n, p in commands().items() if "--trace" in p._option_string_actions}
    assert have == {"prices", "plan", "simulate", "run"}


def test_json_never_holds_infinity_or_nan(capsys):
    doc = {"a": math.inf, "b": [1.5, -math.inf, {"c": math.nan}], "d": (2.0, "x"), "e": None}
    clio.print_json(doc, sort_keys=True)
    text = capsys.readouterr().out

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    assert json.loads(text, parse_constant=refuse) == {
        "a": None, "b": [1.5, None, {"c": None}], "d": [2.0, "x"], "e": None}


def test_interrupt_and_closed_pipe_map_to_quiet_exit_codes(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    def piped() -> int:
        raise BrokenPipeError

    assert clio.guarded(interrupted) == 130
    assert clio.guarded(piped) == 141
    assert clio.guarded(lambda: 3) == 3
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_a_broken_pipe_other_than_stdout_is_a_real_error():
    """Only a closed stdout ends quietly: a socket to a worker or a cloud API breaking keeps
    its traceback (stdout here is a pipe whose reader is still there)."""
    code = ("import sys\nfrom provisioner import clio\n"
            "def socket_broke():\n    raise BrokenPipeError(32, 'Broken pipe')\n"
            "sys.exit(clio.guarded(socket_broke))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "BrokenPipeError" in done.stderr


def test_missing_extra_names_the_extra_to_install():
    aws = clio.missing_extra(ModuleNotFoundError("No module named 'boto3'", name="boto3"))
    assert aws is not None and "pip install 'spotring[aws]'" in aws
    gcp = clio.missing_extra(ImportError("cannot import name 'compute_v1'", name="google.cloud"))
    assert gcp is not None and "pip install 'spotring[gcp]'" in gcp
    assert clio.missing_extra(ModuleNotFoundError("No module named 'scipy'", name="scipy")) is None


def test_completion_prints_shell_code_that_calls_provision_back(capsys):
    pytest.importorskip("argcomplete")
    assert main(["completion", "bash"]) == 0
    code = capsys.readouterr().out
    assert "_ARGCOMPLETE" in code and "provision" in code


def test_completion_answers_from_the_real_parser(tmp_path):
    """What the shell code does on TAB: run provision with _ARGCOMPLETE set and the line."""
    pytest.importorskip("argcomplete")
    line = "provision simulate --policy cheap"
    answer = tmp_path / "answer"
    env = dict(os.environ, _ARGCOMPLETE="1", COMP_LINE=line, COMP_POINT=str(len(line)),
               _ARGCOMPLETE_IFS="\n", _ARGCOMPLETE_STDOUT_FILENAME=str(answer))
    done = subprocess.run(PROVISION, env=env, cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert answer.read_text().split() == ["cheapest-first"]


# --- real processes on a real trace --------------------------------------------------------


def gcp_trace(shared_data: Path) -> Path:
    path = shared_data / "gcp_gpu_price_history" / "gcp_gpu_vm_prices_history.csv.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


def test_json_into_a_pipe_closed_early_ends_without_a_traceback(shared_data):
    # prices --json of the GCP history is ~450 kB: far more than a pipe holds, so the
    # program is still writing when the reader goes away, as with `| head -1`
    proc = subprocess.Popen([*PROVISION, "prices", "--source", "trace", "--trace",
                             str(gcp_trace(shared_data)), "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    code = proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    assert first.strip() == b"["
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err


@pytest.mark.slow
def test_ctrl_c_during_simulate_exits_130_and_prints_nothing(shared_data):
    # --work 1e10 keeps the replay busy for ~30 s; the interrupt comes once it is under way:
    # the program has the trace open (past its imports, inside the command), however long a
    # loaded machine took to get there
    trace = gcp_trace(shared_data)
    # the program as a terminal starts it: SIGINT at its default even when this test runs in
    # a background job (whose SIG_IGN a child inherits, and Python then keeps ignoring it)
    proc = subprocess.Popen([*PROVISION, "simulate", "--trace", str(trace),
                             "--work", "1e10", "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def reading_the_trace() -> bool:
        try:
            fds = os.listdir(f"/proc/{proc.pid}/fd")
        except OSError:
            return False
        return any(_link(f"/proc/{proc.pid}/fd/{fd}") == str(trace.resolve()) for fd in fds)

    from tests.fakes.wait import wait_for

    assert wait_for(reading_the_trace, 120, step_s=0.02), proc.communicate()
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert out == b"" and err == b""


def test_help_fits_an_80_by_24_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    top = build_parser().format_help().splitlines()
    assert len(top) <= 22, "\n".join(top)  # with the command line and the prompt: 24 rows
    for name, parser in {"provision": build_parser(), **commands()}.items():
        text = parser.format_help()
        too_wide = [line for line in text.splitlines() if len(line) > 80]
        assert not too_wide, f"{name} --help: {too_wide}"
        assert "PATH [PATH ...]" not in text and "COMMAND ... " + name not in text


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
