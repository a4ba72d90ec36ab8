"""The user's code packed for a cloud run (provisioner/drivers/code.py): what git would commit
(or a walk honouring .gitignore), no symlink out, a size limit, one folder one SHA-256; bad
flags are one line naming the flag, exit 2, nothing started."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.drivers import code
from provisioner.errors import UserError

JOB = "import helper\n\ndef make_job(seed):\n    return helper.build(seed)\n"


def project(root: Path) -> Path:
    """A small project: a job, a helper beside it, requirements, an ignored data folder, a
    cache file, a link inside."""
    (root / "data").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "train.py").write_text(JOB)
    (root / "helper.py").write_text("def build(seed):\n    return seed\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "requirements.txt").write_text("tinypkg==1.0\n")
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / "notes.log").write_text("x\n")
    (root / ".gitignore").write_text("# data and logs\ndata/\n*.log\n!keep.log\n")
    (root / "keep.log").write_text("kept\n")
    (root / "util_link.py").symlink_to("pkg/util.py")
    return root


def names(packed: code.Packed) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(packed.path) as tar:
        return {m.name: m for m in tar.getmembers()}


WANT = {".gitignore", "train.py", "helper.py", "pkg/util.py", "run.sh", "requirements.txt",
        "keep.log", "util_link.py"}


def test_a_plain_folder_honours_its_gitignore_and_keeps_links_inside(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    packed = code.pack(root, root / "train.py", tmp_path)
    members = names(packed)
    assert set(members) == WANT
    assert packed.job == "train.py" and packed.files == len(WANT)
    link = members["util_link.py"]
    assert link.issym() and link.linkname == "pkg/util.py"
    assert members["run.sh"].mode == 0o755 and members["helper.py"].mode == 0o644
    assert {(m.mtime, m.uid, m.gid, m.uname) for m in members.values()} == {(0, 0, 0, "")}
    assert (root / "data" / "big.bin").exists()  # read only: nothing of the folder changed


def test_a_git_work_tree_packs_what_git_would_commit(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "pkg" / ".gitignore").write_text("secret.txt\n")  # a nested one: git honours it
    (root / "pkg" / "secret.txt").write_text("s\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "train.py"], check=True)
    (root / "train.py").rename(root / "train2.py")  # tracked but gone: skipped
    (root / "train2.py").rename(root / "train.py")
    packed = code.pack(root, root / "train.py", tmp_path)
    assert set(names(packed)) == WANT | {"pkg/.gitignore"}
    assert not any(n.startswith(".git/") for n in names(packed))


def test_the_same_folder_gives_the_same_sha256(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = code.pack(root, root / "train.py", tmp_path / "a")
    os.utime(root / "helper.py", (1, 1))  # times do not count
    second = code.pack(root, root / "train.py", tmp_path / "b")
    assert first.sha256 == second.sha256 and first.path.read_bytes() == second.path.read_bytes()
    (root / "helper.py").write_text("def build(seed):\n    return seed + 1\n")
    assert code.pack(root, root / "train.py", tmp_path / "b").sha256 != first.sha256


@pytest.mark.parametrize("target", ["/etc/hostname", "../outside.py", "nowhere.py"])
def test_a_symlink_out_of_the_folder_is_refused_naming_it(tmp_path: Path, target: str) -> None:
    root = project(tmp_path / "p")
    (tmp_path / "outside.py").write_text("x = 1\n")
    (root / "pkg" / "escape.py").symlink_to(target)
    with pytest.raises(UserError, match=r"pkg/escape\.py is a symlink to") as err:
        code.pack(root, root / "train.py", tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / code.ARCHIVE_NAME).exists()


def test_a_folder_link_out_is_refused_too(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "etc").symlink_to("/etc")
    with pytest.raises(UserError, match=r"etc is a symlink to /etc, outside the folder"):
        code.pack(root, root / "train.py", tmp_path)


def test_the_size_limit_is_one_line_naming_the_largest(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "weights.pt").write_bytes(b"\1" * 300_000)
    with pytest.raises(UserError, match=r"over the 0 MB limit.*weights\.pt \(0\.3 MB\)"):
        code.pack(root, root / "train.py", tmp_path, max_mb=0.2)
    code.pack(root, root / "train.py", tmp_path, max_mb=1)  # under it: packed


def test_the_job_must_be_a_packed_file_of_the_folder(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (tmp_path / "other.py").write_text(JOB)
    with pytest.raises(UserError, match="not inside the code folder"):
        code.pack(root, tmp_path / "other.py", tmp_path)
    (root / "data" / "job.py").write_text(JOB)
    with pytest.raises(UserError, match="not among the files packed"):
        code.pack(root, root / "data" / "job.py", tmp_path)


def test_a_module_shadowing_spotrings_own_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "trainer.py").write_text("x = 1\n")
    with pytest.raises(UserError, match="trainer.py beside the job would shadow"):
        code.pack(root, root / "train.py", tmp_path)


@pytest.mark.parametrize(("rel", "is_dir", "want"), [
    ("a.log", False, True), ("sub/a.log", False, True), ("keep.log", False, False),
    ("data", True, True), ("data", False, False), ("build/x.py", False, False),
    ("docs/api/x.md", False, True), ("src/docs/api/x.md", False, False),
    ("deep/cache/x", False, True),
])
def test_the_gitignore_subset(rel: str, is_dir: bool, want: bool) -> None:
    patterns = code.parse_gitignore("# c\n*.log\n!keep.log\ndata/\n/docs/api/*\n\n**/cache/*\n")
    assert code.ignored(rel, is_dir, patterns) is want


def test_bad_code_flags_are_one_line_exit_2(tmp_path: Path, capsys) -> None:
    root = project(tmp_path / "p")
    (root / "leak").symlink_to("/etc")
    cfg = tmp_path / "aws.toml"
    cfg.write_text('[cloud]\ndriver = "aws"\nartifacts = "s3://b/artifacts"\n'
                   f'[daemon]\nstate_path = "{tmp_path / "state.sqlite"}"\n')
    cases = [
        (["run", "--config", str(cfg), "--job", str(root / "train.py"), "--code",
          str(tmp_path / "nope")], "--code", "not a folder"),
        (["run", "--config", str(cfg), "--job", "pkg.mod", "--code", str(root)], "--code",
         "is a module name"),
        (["run", "--job", str(root / "train.py"), "--code", str(root), "--workdir",
          str(tmp_path / "w")], "--code", "a local run"),
        (["check", "--job", str(root / "train.py"), "--code", str(root)], "--code",
         "leak is a symlink to /etc"),
        (["run", "--config", str(cfg), "--job", "train.py", "--code",
          "git+https://example.com/repo"], "--code", "no @REF"),
        (["run", "--config", str(cfg), "--job", "/abs/train.py", "--code",
          "git+https://example.com/repo@v1"], "--job", "path inside the repository"),
    ]
    for argv, flag, why in cases:
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.count("\n") == 0 and flag in err and why in err, (argv, err)
    assert not (tmp_path / "w").exists() and not (tmp_path / "state.sqlite").exists()


def test_check_builds_the_job_from_the_packed_code(tmp_path: Path, capsys) -> None:
    """``provision check --code`` builds the job from the archive as a worker gets it: a
    helper the packing leaves out (here: ignored) fails the check."""
    root = tmp_path / "p"
    root.mkdir()
    (root / "train.py").write_text(
        "import helper\nfrom trainer.job import Job\n\ndef make_job(seed):\n"
        "    return helper.job()\n")
    (root / "helper.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\nfrom trainer.job import "
        "Job\n\ndef job():\n    m = torch.nn.Linear(2, 1)\n    return Job(model=m, optimizer="
        "torch.optim.SGD(m.parameters(), lr=0.1), loss_fn=torch.nn.functional.mse_loss, "
        "train_set=TensorDataset(torch.zeros(16, 2), torch.zeros(16, 1)), global_batch=4, "
        "epochs=1)\n")
    assert main(["check", "--job", str(root / "train.py"), "--code", str(root)]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    (root / ".gitignore").write_text("helper.py\n")
    assert main(["check", "--job", str(root / "train.py"), "--code", str(root)]) == 2
    assert "helper" in capsys.readouterr().err


# -- a git URL and ref: resolved and packed by the daemon's host ---------------------------------

def repo_with_tag(root: Path) -> str:
    """A git repository holding the project, tagged v1; returns the commit."""
    project(root)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_git_ref_is_cloned_here_and_packed_as_its_commit_holds(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit = repo_with_tag(repo)
    (repo / "helper.py").write_text("changed after the tag\n")  # not in v1: not packed
    (repo / "untracked.py").write_text("x = 1\n")
    for ref in ("v1", commit):
        with code.code_root(f"git+file://{repo}@{ref}", "train.py") as (root, job, origin):
            packed = code.pack(root, job, tmp_path)
            assert commit[:12] in origin
            clone = root
        assert not clone.exists()  # the clone is gone after packing
        members = names(packed)
        assert "untracked.py" not in members and "train.py" in members
        with tarfile.open(packed.path) as tar:
            assert tar.extractfile("helper.py").read() == b"def build(seed):\n    return seed\n"


@pytest.mark.parametrize(("spec", "job", "says"), [
    ("git+https://example.com/repo", "train.py", "no @REF"),
    ("git+ftp://example.com/repo@v1", "train.py", "not a git URL"),
    ("git+https://example.com/repo@v1;rm", "train.py", "is not a tag, branch or commit"),
    ("git+file:///nonexistent/repo@v1", "train.py", "git could not clone"),
    ("REPO@nope", "train.py", "git could not check out nope"),
    ("REPO@v1", "missing.py", "no such file in"),
    ("REPO@v1", "../train.py", "path inside the repository"),
])
def test_bad_git_sources_are_one_line(tmp_path: Path, spec: str, job: str, says: str) -> None:
    repo = tmp_path / "repo"
    repo_with_tag(repo)
    spec = spec.replace("REPO", f"git+file://{repo}")
    with pytest.raises(UserError, match=re.escape(says)) as err:
        with code.code_root(spec, job):
            pass
    assert "\n" not in str(err.value)


def test_check_builds_a_job_from_a_git_ref(tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    repo_with_tag(repo)
    (repo / ".gitignore").unlink()
    rc = main(["check", "--job", "nope/train.py", "--code", f"git+file://{repo}@v1"])
    assert rc == 2 and "no such file in" in capsys.readouterr().err
