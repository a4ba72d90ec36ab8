"""``provision run --job`` and ``--metrics-host``: bad input is one line naming the flag and
the fix, exit 2, with nothing created; a good job file is checked without importing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.daemon.run.jobspec import DEFAULT_JOB, check_job
from provisioner.errors import UserError

from tests.conftest import REPO


def run(capsys, *args: str):
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("content, why", [
    (None, "no such file"),
    ("import torch\n\ndef build(seed):\n    return None\n", "defines no make_job"),
    ("def make_job(seed:\n", "not valid Python"),
])
def test_bad_job_file_is_one_line_exit_2_and_nothing_created(tmp_path, capsys, content, why):
    job = tmp_path / "myjob.py"
    if content is not None:
        job.write_text(content)
    wd = tmp_path / "w"
    code, out, err = run(capsys, "run", "--job", str(job), "--workdir", str(wd), "--no-dashboard")
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "--job" in err and why in err, err
    assert not wd.exists()


def test_unknown_module_and_bad_name(tmp_path, capsys):
    for spec in ("no_such_pkg_xyz.job", "not a module!"):
        code, _out, err = run(capsys, "run", "--job", spec, "--workdir", str(tmp_path / "w"))
        assert code == 2 and "--job" in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "w").exists()


def test_config_job_file_is_checked_naming_the_setting(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[job]\njob_file = "nowhere/job.py"\n')
    code, _out, err = run(capsys, "run", "--config", str(cfg), "--workdir", str(tmp_path / "w"))
    assert code == 2 and "job.job_file" in err, err


def test_good_job_is_resolved_without_importing_it(tmp_path, monkeypatch):
    job = tmp_path / "myjob.py"
    # importing this would raise: the check must read the syntax tree only
    job.write_text("raise SystemExit('imported!')\n\ndef make_job(seed):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    assert check_job("myjob.py", "--job") == str(job.resolve())
    (tmp_path / "reexport.py").write_text("from myjob import make_job\n")
    assert check_job("reexport.py", "--job").endswith("reexport.py")
    assert check_job(DEFAULT_JOB, "job.job_file") == DEFAULT_JOB  # the packaged example
    assert check_job(str(REPO / "examples" / "digits.py"), "--job").endswith("digits.py")


def test_cloud_job_is_a_file_of_its_code_or_a_module_of_the_image(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text("def make_job(seed):\n    return None\n")
    # a file travels with its code (--code, default its folder): checked as on a local run
    assert check_job(str(job), "--job", cloud=True) == str(job.resolve())
    with pytest.raises(UserError, match="no such file"):
        check_job(str(tmp_path / "nope.py"), "--job", cloud=True)
    # a module the daemon host does not have is fine: the workers' image has it
    assert check_job("mypkg.myjob", "--job", cloud=True) == "mypkg.myjob"


def test_metrics_host_needs_a_port(tmp_path, capsys):
    code, _out, err = run(capsys, "run", "--metrics-host", "0.0.0.0", "--workdir",
                          str(tmp_path / "w"))
    assert code == 2 and "--metrics-host" in err and "--metrics-port" in err, err
    assert not (tmp_path / "w").exists()


def test_metrics_section_is_a_setting(tmp_path):
    from provisioner.config import load_settings
    from provisioner.errors import ConfigError

    cfg = tmp_path / "c.toml"
    cfg.write_text('[metrics]\nhost = "0.0.0.0"\nport = 9400\n')
    s = load_settings(cfg)
    assert (s.metrics.host, s.metrics.port) == ("0.0.0.0", 9400)
    assert load_settings(None).metrics.host == "127.0.0.1"  # loopback unless told
    cfg.write_text("[metrics]\nport = 70000\n")
    with pytest.raises(ConfigError, match="metrics.port"):
        load_settings(cfg)


def test_help_names_the_new_flags_and_commands(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for flag in ("--job", "--detach", "--metrics-host"):
        assert flag in text
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for cmd in ("list (runs)", "logs", "down"):
        assert cmd in text


#: A small job for the build check: ``EPOCHS`` from the run's limit when it gives one
#: (SPOTRING_UNTIL_EPOCHS, as every worker gets it), else 5; ``BREAK`` makes make_job raise.
SMALL_JOB = '''
import os
import torch
from torch.utils.data import TensorDataset
from trainer.job import Job


def make_job(seed, **bad):
    if os.environ.get("BREAK_MAKE_JOB"):
        return Job(model=None, wrong_keyword=1)
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    return Job(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
               loss_fn=torch.nn.functional.cross_entropy, train_set=TensorDataset(x, y),
               global_batch=8, epochs=int(os.environ.get("SPOTRING_UNTIL_EPOCHS", "5")),
               evaluate=lambda m: {"mse": 0.5, "r2": 0.1})
'''


def test_check_builds_the_job_and_refuses_what_breaks_before_anything_starts(
        tmp_path, capsys, monkeypatch):
    """Issue 31.4: `provision check --job` builds the job (make_job, one batch through the
    model) and nothing else; `provision run` does the same before anything is launched, so
    a make_job that raises at run time is one line, exit 2, no workdir; --until-epochs
    applies to a job that takes it and is refused for one that would train past it."""
    job = tmp_path / "myjob.py"
    job.write_text(SMALL_JOB)
    code, out, err = run(capsys, "check", "--job", str(job), "--until-epochs", "3")
    assert code == 0, err
    assert "builds; 10 parameters, 3 epochs of 40 samples (5 steps of 8)" in out, out
    assert "one batch of 8 through the model: loss" in out and "evaluate" in out, out
    # a job that trains 5 epochs whatever it is told is refused --until-epochs 3 ...
    fixed = tmp_path / "fixed.py"
    fixed.write_text(SMALL_JOB.replace('os.environ.get("SPOTRING_UNTIL_EPOCHS", "5")', '"5"'))
    code, _, err = run(capsys, "check", "--job", str(fixed), "--until-epochs", "3")
    assert code == 2 and err.count("\n") == 1, err
    assert "--until-epochs 3:" in err and "trains 5 epochs" in err and "--until-steps 15" in err
    # ... and by `provision run` too, before its workdir exists
    wd = tmp_path / "w"
    code, _, err = run(capsys, "run", "--job", str(fixed), "--until-epochs", "3",
                       "--workdir", str(wd), "--no-dashboard")
    assert code == 2 and "trains 5 epochs" in err and not wd.exists(), err
    # a make_job that raises when it runs (a bad keyword): found here, not on the fleet
    monkeypatch.setenv("BREAK_MAKE_JOB", "1")
    code, _, err = run(capsys, "run", "--job", str(job), "--workdir", str(wd),
                       "--no-dashboard")
    assert code == 2 and err.count("\n") == 1, err
    assert f"--job {job}: the job does not build here" in err and "wrong_keyword" in err
    assert not wd.exists()
