"""The worker boot scripts, rendered by terraform and run for real as root on fake instances
(tests/fakes/instances.py: own /etc, /opt and /var/lib, PATH shims, a metadata service that
answers from the instance's moto tags or fake-GCP metadata).

What a launch says reaches the workers: job, mode, hybrid group, GPUs; one worker per GPU,
named ``<instance id>/<gpu>``; spotring is the wheel the daemon shipped, fetched from the run's
artifacts and installed pinned by its SHA-256; the user's code (``--code``) fetched, checked
by its SHA-256, unpacked, its requirements.txt installed, and the job run from it. A value the
boot cannot use is refused before anything is installed (the code: before any worker
starts), with one line in the instance's log and its own exit code
(provisioner/drivers/boot.py); Python is checked first of all. Every line the boot and the
workers print is shipped to the run's artifacts (``logs/<instance id>/<unit>/<seq>``), and a
failed boot or worker unit ships its exit report (``exits/<instance id>/<unit>``,
provisioner/drivers/shiplog.py), never the token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("moto.server")

from provisioner.drivers.boot import LAUNCH_VALUES, BootExit  # noqa: E402
from tests.fakes import instances as fi  # noqa: E402
from tests.fakes.metadata import AwsView, GcpView, MetadataServer  # noqa: E402
from tests.fakes.wait import wait_for  # noqa: E402

pytestmark = [pytest.mark.terraform, pytest.mark.slow]
WHY = fi.unavailable()
TOKEN = "ring-token-0123456789abcdef0123456789abcdef"
BUCKET = "spotring-boot-artifacts"
PY310 = Path("/root/.pyenv/versions/3.10.13")


def _values(cloud: str, **over: str) -> dict[str, str]:
    common = {"coordinator": "127.0.0.1:29999", "token_path": "/etc/spotring/ring-token",
              "job_module": "spotring_boot_job", "extra_args": "--connect-timeout 2",
              "python": fi.IMAGE_PYTHON, "wheel_url": "", "wheel_sha256": "",
              "index_requirement": ""}
    if cloud == "aws":
        common.update(region="us-east-1", token_parameter="/spotring/boot/ring-token",
                      artifacts=f"s3://{BUCKET}/artifacts/")
    else:
        common.update(project="spotring-e2e", secret="spotring-boot-ring-token",
                      artifacts=f"gs://{BUCKET}/artifacts/")
    return {**common, **over}


class AwsBoot:
    """A moto account with the token in SSM and the wheel in the artifacts bucket; boots
    fake instances tagged as a launch would tag them."""

    def __init__(self, tmp: Path) -> None:
        import boto3

        from tests.fakes.aws_world import AwsWorld

        self.world = AwsWorld()
        self.tmp = tmp
        kw = {"region_name": "us-east-1", "endpoint_url": self.world.endpoint}
        boto3.client("ssm", **kw).put_parameter(Name="/spotring/boot/ring-token", Value=TOKEN,
                                                Type="SecureString")
        s3 = boto3.client("s3", **kw)
        s3.create_bucket(Bucket=BUCKET)
        wheel, self.sha = fi.test_wheel()
        self.wheel = f"s3://{BUCKET}/artifacts/{self.sha}/{wheel.name}"
        s3.upload_file(str(wheel), BUCKET, f"artifacts/{self.sha}/{wheel.name}")
        self.image = fi.make_image()
        self.servers: list[MetadataServer] = []
        self.boxes: list[fi.Sandbox] = []
        self.n = 0

    def shipped(self) -> Any:
        """The run's shipped logs, read as the daemon reads them (the artifacts store)."""
        from provisioner.drivers.artifacts import S3Store
        from provisioner.drivers.shiplog import StoreLogs

        return StoreLogs(S3Store(BUCKET, "artifacts", "us-east-1", self.world.endpoint))

    def every_object(self) -> str:
        """The text of every object shipped under logs/ and exits/."""
        store = self.shipped().store
        return "".join(store.read(k).decode(errors="replace")
                       for p in ("logs/", "exits/") for k in store.list(p))

    def launch_values(self, **values: str) -> dict[str, str]:
        return {"SPOTRING_WHEEL": self.wheel, "SPOTRING_WHEEL_SHA256": self.sha, **values}

    def boot(self, env: dict[str, str], *, gpus: int = 0, image: fi.Image | None = None,
             **render: str) -> tuple[fi.Sandbox, str, MetadataServer]:
        tags = [{"Key": "spotring:job", "Value": "boot"}] + [
            {"Key": f"spotring:env:{k}", "Value": v} for k, v in env.items()]
        iid = self.world.ec2.run_instances(
            ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"][0][
            "InstanceId"]
        server = MetadataServer(AwsView(self.world.ec2, iid)).__enter__()
        self.servers.append(server)
        self.n += 1
        box = fi.Sandbox(self.tmp / f"i{self.n}", fi.render("aws", _values("aws", **render)),
                         image or self.image,
                         {"http_proxy": server.endpoint, "AWS_ENDPOINT_URL": self.world.endpoint,
                          "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                          "AWS_DEFAULT_REGION": "us-east-1"}, gpus=gpus).start()
        self.boxes.append(box)
        return box, iid, server

    def close(self) -> None:
        for box in self.boxes:
            box.kill()
        for server in self.servers:
            server.__exit__(None, None, None)
        self.world.close()
        fi.shutil.rmtree(self.image.site, ignore_errors=True)


@pytest.fixture(scope="module")
def aws(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if WHY:
        pytest.skip(WHY)
    boot = AwsBoot(tmp_path_factory.mktemp("boot-aws"))
    yield boot
    boot.close()


def refused(box: fi.Sandbox, code: int, aws: AwsBoot | None = None, iid: str = "") -> str:
    """The one error line of a boot that exited ``code`` having installed and started
    nothing (and, given ``aws``, shipped that line with its exit code before it exited)."""
    assert fi.wait_rc(box, 120) == code, box.log()
    if aws is not None:
        [report] = aws.shipped().reports(iid)
        assert (report.unit, report.code) == ("boot", code), report
        assert report.lines[-1].startswith("spotring-boot: error:"), report
        assert report.lines[-1] in [ln for _, ln in aws.shipped().lines(iid, "boot")]
    lines = [ln for ln in box.log().splitlines() if ln.startswith("spotring-boot: error:")]
    assert len(lines) == 1 and lines[0].endswith(f"(exit {code})"), box.log()
    assert not (box.root / "opt" / "spotring").exists(), "installed before refusing"
    assert not (box.root / "etc" / "spotring" / "ring-token").exists()
    assert box.units() == {}
    return lines[0]


def test_a_launch_reaches_every_gpus_worker_with_the_pinned_wheel(aws: AwsBoot) -> None:
    box, iid, _ = aws.boot(aws.launch_values(SPOTRING_JOB="spotring_boot_job",
                                             SPOTRING_MODE="hybrid",
                                             SPOTRING_ZONE="us-east-1/us-east-1b"),
                           gpus=2)
    assert fi.wait_rc(box, 180) == 0, box.log()
    unit = box.unit_file("spotring-worker@.service")
    start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert (f"--job spotring_boot_job --zone us-east-1/us-east-1b --mode hybrid --name {iid}/%i "
            f"--device cuda:%i --notice-url http://169.254.169.254/latest/meta-data/spot/"
            f"instance-action") in start
    two = {"spotring-worker@0.service", "spotring-worker@1.service"}
    assert wait_for(lambda: set(box.units()) == two, 60), box.units()
    # spotring is the shipped wheel, in the workers' own venv (the checkout is not visible)
    site = next((box.root / "opt" / "spotring" / "lib").glob("python3.*")) / "site-packages"
    assert (site / "trainer" / "__main__.py").is_file()
    record = json.loads((next(site.glob("spotring-*.dist-info")) / "direct_url.json")
                        .read_text())
    assert record["url"].endswith(Path(aws.wheel).name)
    # the token: the service user's, 0600, and in no log
    token = box.root / "etc" / "spotring" / "ring-token"
    uid = next(int(ln.split(":")[2]) for ln in (box.root / "etc" / "passwd").read_text()
               .splitlines() if ln.startswith("spotring:"))
    assert token.read_text().strip() == TOKEN
    assert (token.stat().st_mode & 0o777, token.stat().st_uid) == (0o600, uid)
    # each worker ran as that user on cuda:<its GPU>; this host has no CUDA, so each ends with
    # a device error (exit 2), which the unit does not restart in a loop
    assert wait_for(lambda: all(u["runs"][-1]["rc"] is not None for u in box.units().values())
                    and len(box.units()) == 2, 120)
    for name, unit_state in box.units().items():
        assert [r["rc"] for r in unit_state["runs"]] == [2], box.journal(name)
        gpu = name.split("@")[1].split(".")[0]
        assert f"--device cuda:{gpu}" in box.journal(name)
    assert TOKEN not in box.log() + "".join(box.journal(u) for u in box.units())
    # shipped: the boot's lines, each worker's, and each failed worker's report (exit 2)
    logs = aws.shipped()
    assert wait_for(lambda: {r.unit for r in logs.reports(iid)} == two, 60), logs.reports(iid)
    assert {r.code for r in logs.reports(iid)} == {2}
    want = {("boot", box.log().splitlines()[-1])} | {
        (name, next(ln for ln in box.journal(name).splitlines() if ln.startswith("error:")))
        for name in two}
    # lines ship in chunks of their own, apart from the exit reports: wait for them too (a
    # loaded machine had shipped a report before the error line it follows)
    wait_for(lambda: want <= set(logs.lines(iid)), 60)
    lines = logs.lines(iid)
    assert ("boot", box.log().splitlines()[-1]) in lines
    for name in two:
        err = next(ln for ln in box.journal(name).splitlines() if ln.startswith("error:"))
        assert (name, err) in lines
    assert TOKEN not in aws.every_object()


@pytest.mark.parametrize(("env", "gpus", "code", "says"), [
    ({"SPOTRING_JOB": "x; touch /tmp/pwned"}, 0, BootExit.JOB, "SPOTRING_JOB"),
    ({"SPOTRING_MODE": "pipeline"}, 0, BootExit.MODE, "SPOTRING_MODE"),
    ({"SPOTRING_ZONE": "Zone A"}, 0, BootExit.ZONE, "SPOTRING_ZONE"),  # a group: region/zone
    ({"SPOTRING_GPUS": "4"}, 1, BootExit.GPUS, "nvidia-smi -L lists 1 GPUs"),
    ({"SPOTRING_DEVICE": "tpu"}, 0, BootExit.GPUS, "SPOTRING_DEVICE"),
    ({"SPOTRING_DEVICE": "cuda"}, 0, BootExit.GPUS, "no GPU"),
    ({"SPOTRING_WHEEL": "s3://elsewhere/a/spotring-0.1.0-py3-none-any.whl"}, 0, BootExit.WHEEL,
     "not in this deployment's artifacts"),
    ({"SPOTRING_WHEEL_SHA256": "0" * 64}, 0, BootExit.FETCH, "its SHA-256 is not"),
    ({"SPOTRING_WHEEL": "", "SPOTRING_WHEEL_SHA256": ""}, 0, BootExit.WHEEL,
     "no spotring wheel"),
], ids=["job", "mode", "zone", "gpus-missing", "device", "no-gpu", "wheel-elsewhere",
        "sha-differs", "no-wheel"])
def test_a_value_the_boot_cannot_use_is_refused_before_anything_runs(
        aws: AwsBoot, env: dict[str, str], gpus: int, code: int, says: str) -> None:
    values = {k: v for k, v in aws.launch_values(**env).items() if v}
    box, iid, _ = aws.boot(values, gpus=gpus)
    assert says in refused(box, code, aws, iid)


def test_the_daemon_ends_a_failed_boot_from_what_it_shipped(aws: AwsBoot, tmp_path: Path) -> None:
    """The real boot fails on a launch value and ships its report to (moto) S3; the daemon's
    boot watch reads it there, terminates the EC2 instance at once through the AWS driver,
    and records the exit code, its docs line and the boot's last lines."""
    import time

    from pricing.model import Offering
    from provisioner.daemon.loop.actuator import WriteAheadActuator
    from provisioner.daemon.state import State
    from provisioner.drivers.aws import AwsDriver
    from provisioner.timing import Intervals

    box, iid, _ = aws.boot(aws.launch_values(SPOTRING_MODE="pipeline"))
    assert fi.wait_rc(box, 120) == BootExit.MODE, box.log()
    state = State(tmp_path / "state.sqlite")
    offering = Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge")
    state.begin_launch("t1", offering, 1, 0.0)
    state.finish_launch("t1", [(iid, offering)], 0.0)
    act = WriteAheadActuator("boot", AwsDriver(aws.world.settings("boot").aws), state,
                             time.time, Intervals(), logs=aws.shipped())
    assert act.watch_boots() == [iid]
    (ev,) = state.events(kinds=["boot-failed"])
    assert ev.detail.startswith("boot exit 21: `SPOTRING_MODE` is not `ring` or `hybrid`")
    assert "SPOTRING_MODE=pipeline is not usable" in ev.detail.splitlines()[-1]
    assert offering in act.unavailable.members() and act.job_error is None
    assert aws.world.ec2.describe_instances(InstanceIds=[iid])["Reservations"][0][
        "Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")
    state.close()


def test_the_token_parameter_must_be_readable(aws: AwsBoot) -> None:
    box, _, _ = aws.boot(aws.launch_values(), token_parameter="/spotring/none/ring-token")
    assert fi.wait_rc(box, 180) == BootExit.TOKEN, box.log()
    assert not (box.root / "etc" / "spotring" / "ring-token").exists()
    assert not list((box.root / "etc" / "spotring").glob(".ring-token.*"))
    assert box.units() == {}


@pytest.mark.skipif(not PY310.is_dir(), reason=f"no Python 3.10 at {PY310}")
def test_an_image_with_python_310_is_refused_first(aws: AwsBoot) -> None:
    image = fi.Image(PY310, aws.image.site)
    box, iid, server = aws.boot(aws.launch_values(), image=image)
    line = refused(box, BootExit.PYTHON, aws, iid)
    assert "Python 3.10" in line and ">= 3.11" in line
    # before anything else: of the metadata service, only the instance id its exit report needs
    assert [path for _, path in server.requests] == ["/latest/api/token",
                                                     "/latest/meta-data/instance-id"]


def test_an_image_without_torch_is_refused(aws: AwsBoot, tmp_path: Path) -> None:
    bare = fi.make_image()
    try:
        for entry in bare.site.iterdir():
            if entry.name.startswith("torch"):
                entry.unlink()
        box, _, _ = aws.boot(aws.launch_values(), image=bare)
        assert fi.wait_rc(box, 180) == BootExit.DEPS, box.log()
        assert "has no torch" in box.log() and box.units() == {}
    finally:
        fi.shutil.rmtree(bare.site, ignore_errors=True)


# -- GCP -----------------------------------------------------------------------------------------

def test_gcp_boot_names_each_worker_after_the_drivers_id_and_runs_the_users_code(
        tmp_path: Path) -> None:
    """A VM launched by the real GCP driver (its metadata carries the launch values) boots:
    the token from Secret Manager, the wheel and the user's code from GCS, and each worker
    named ``<zone>/<vm name>/<gpu>``: the driver's instance id, which the daemon matches. The
    code (``provision run --job src/train.py --code DIR``, packed by the daemon's packer) is
    checked, unpacked, its requirements.txt installed into the workers' venv from a local
    folder of wheels; both workers import ``helper`` beside the job and ``tinypkg``, join a
    real coordinator and train."""
    if WHY:
        pytest.skip(WHY)
    pytest.importorskip("google.cloud.storage")
    from pricing.model import Offering
    from provisioner.daemon.wiring import make_coordinator
    from provisioner.drivers.base import LaunchRequest
    from provisioner.drivers.code import pack
    from tests.fakes.cloud_run import free_port
    from tests.fakes.gcp_world import PROJECT, GcpWorld
    from tests.fakes.gcs_fake import GcsFake
    from tests.fakes.user_code import make_project, tiny_wheel_dir

    wheel, sha = fi.test_wheel()
    image = fi.make_image()
    job_file = make_project(tmp_path / "project")
    (tmp_path / "packed").mkdir()
    code = pack(tmp_path / "project", job_file, tmp_path / "packed")
    wheels = tiny_wheel_dir(tmp_path / "wheels")
    port = free_port()
    script = fi.render("gcp", _values("gcp", coordinator=f"127.0.0.1:{port}",
                                      extra_args="--connect-timeout 60"))
    coord = make_coordinator("127.0.0.1", port, TOKEN.encode(), heartbeat_timeout_s=5.0)
    with GcpWorld() as world, GcsFake(buckets=[BUCKET]) as gcs:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        bucket = storage.Client(project="x", credentials=AnonymousCredentials(), client_options={
            "api_endpoint": gcs.endpoint}).bucket(BUCKET)
        bucket.blob(f"artifacts/{sha}/{wheel.name}").upload_from_filename(str(wheel))
        bucket.blob(f"artifacts/{code.sha256}/code.tar.gz").upload_from_filename(str(code.path))
        world.fake.set_secret(PROJECT, "spotring-boot-ring-token", TOKEN)
        settings = world.settings("boot-gcp")
        launched = world.driver(settings).launch(LaunchRequest(
            Offering("gcp", "us-central1", "us-central1-a", "g2-standard-8"), 1, "boot-gcp",
            "tok-1", {"SPOTRING_JOB": code.job, "SPOTRING_DEVICE": "cpu",
                      "SPOTRING_GPUS": "2", "SPOTRING_WHEEL":
                      f"gs://{BUCKET}/artifacts/{sha}/{wheel.name}",
                      "SPOTRING_WHEEL_SHA256": sha,
                      "SPOTRING_CODE": f"gs://{BUCKET}/artifacts/{code.sha256}/code.tar.gz",
                      "SPOTRING_CODE_SHA256": code.sha256})).instances[0]
        zone, _, name = launched.id.partition("/")
        with MetadataServer(GcpView(world.fake, PROJECT, zone, name)) as server:
            box = fi.Sandbox(tmp_path / "vm", script, image, {
                "http_proxy": server.endpoint,
                "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": world.endpoint + "/",
                "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": gcs.endpoint + "/",
                "PIP_FIND_LINKS": str(wheels), "PIP_NO_INDEX": "1"}).start()
            try:
                assert fi.wait_rc(box, 180) == 0, box.log()
                unit = box.unit_file("spotring-worker@.service").splitlines()
                start = next(ln for ln in unit if ln.startswith("ExecStart="))
                assert f"--name {launched.id}/%i --device cpu" in start
                assert "--zone us-central1-a " in start and "--mode" not in start
                assert "--notice-url http://metadata.google.internal/computeMetadata/v1/" \
                       "instance/preempted" in start
                # the job from the code's own folder, started in its folder
                code_dir = f"/var/lib/spotring/code/{code.sha256}"
                assert f"--job {code_dir}/src/train.py " in start
                assert f"WorkingDirectory={code_dir}/src" in unit
                assert wait_for(lambda: set(box.units()) == {"spotring-worker@0.service",
                                                             "spotring-worker@1.service"}, 60)
                token = box.root / "etc" / "spotring" / "ring-token"
                assert token.read_text() == TOKEN and token.stat().st_mode & 0o777 == 0o600
                # both workers joined the real ring and trained
                members = {f"{launched.id}/0", f"{launched.id}/1"}

                def stopped() -> str | None:
                    done = {u: s["runs"] for u, s in box.units().items()
                            if s["runs"] and s["runs"][-1]["rc"] is not None}
                    return f"a worker ended: {done} {box.journal(next(iter(done)))}" \
                        if done else None

                assert wait_for(lambda: {m.name for m in coord.members()
                                         if m.state == "active"} == members
                                and int(coord.stats().get("step") or 0) >= 3, 150,
                                abort=stopped), (coord.members(), coord.stats())
                # each imported helper from the unpacked code and tinypkg from the venv
                unpacked = box.root / "var-lib" / "spotring" / "code" / code.sha256
                marks = [p.read_text().splitlines() for p in
                         (unpacked / "src").glob("imported-*.txt")]
                assert len(marks) >= 2, box.journal("spotring-worker@0.service")
                for helper, tiny, value in marks:
                    assert helper == f"{code_dir}/src/helper.py"
                    assert tiny.startswith("/opt/spotring/lib/") and value == "42"
                assert not (unpacked / "data").exists()  # .gitignore'd: not shipped
                assert (unpacked / "requirements.txt").is_file()
                # its lines are shipped to GCS under the driver's id <zone>/<vm name>
                from provisioner.drivers.artifacts import GcsStore
                from provisioner.drivers.shiplog import StoreLogs

                logs = StoreLogs(GcsStore(BUCKET, "artifacts", gcs.endpoint))
                last = ("boot", box.log().splitlines()[-1])
                assert wait_for(lambda: last in logs.lines(launched.id), 30), \
                    logs.lines(launched.id)
            finally:
                box.kill()
                coord.stop()
    fi.shutil.rmtree(image.site, ignore_errors=True)


@pytest.mark.parametrize(("code_sha", "job", "code", "says"), [
    ("0" * 64, "src/train.py", BootExit.CODE_SHA256, "its SHA-256 is not"),
    (None, "train.py", BootExit.JOB, "carries no code"),
], ids=["code-sha-differs", "file-job-without-code"])
def test_code_that_does_not_match_its_hash_fails_the_boot_with_its_code(
        aws: AwsBoot, tmp_path: Path, code_sha: str | None, job: str, code: int,
        says: str) -> None:
    from provisioner.drivers.code import pack
    from tests.fakes.user_code import make_project

    job_file = make_project(tmp_path / "project")
    packed = pack(tmp_path / "project", job_file, tmp_path)
    key = f"artifacts/{packed.sha256}/code.tar.gz"
    import boto3

    boto3.client("s3", region_name="us-east-1", endpoint_url=aws.world.endpoint).upload_file(
        str(packed.path), BUCKET, key)
    env = aws.launch_values(SPOTRING_JOB=job)
    if code_sha is not None:
        env.update(SPOTRING_CODE=f"s3://{BUCKET}/{key}", SPOTRING_CODE_SHA256=code_sha)
    box, _, _ = aws.boot(env)
    assert fi.wait_rc(box, 180) == code, box.log()
    lines = [ln for ln in box.log().splitlines() if ln.startswith("spotring-boot: error:")]
    assert len(lines) == 1 and lines[0].endswith(f"(exit {int(code)})") and says in lines[0], \
        box.log()
    assert box.units() == {}  # no worker started
    assert not (box.root / "var-lib" / "spotring" / "code" / packed.sha256).exists()


# -- one contract: the patterns and exit codes of boot.py are the scripts' ----------------------

@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_scripts_check_each_launch_value_as_the_drivers_do(cloud: str) -> None:
    text = fi.TEMPLATES[cloud].read_text()
    checks = dict((m[0], (int(m[1]), m[2])) for m in re.findall(
        r"check (SPOTRING_\w+) \"\$\w+\" (\d+) '([^']+)'", text))
    assert checks == {k: (int(v.code), v.pattern) for k, v in LAUNCH_VALUES.items()}
    codes = {int(c) for c in re.findall(r"fail (\d+) ", text)}
    assert codes <= {int(c) for c in BootExit}, codes
    assert {int(BootExit.PYTHON), int(BootExit.METADATA), int(BootExit.TOKEN),
            int(BootExit.DEPS), int(BootExit.FETCH)} <= codes


def test_docs_list_every_boot_exit_code() -> None:
    text = (fi.REPO / "docs" / "deploy.md").read_text()
    table = text.split("### Boot exit codes", 1)[1].split("###", 1)[0]
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    assert listed == {int(c) for c in BootExit}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_shipper_drops_every_line_holding_the_token(cloud: str, tmp_path: Path) -> None:
    """Whatever a worker prints, a line holding the ring token is never shipped: the
    shipper's filter (the rendered script's own function) with the token file in place."""
    import shutil
    import subprocess

    if shutil.which("terraform") is None:
        pytest.skip("terraform not installed (it renders the boot scripts)")
    token = tmp_path / "ring-token"
    token.write_text(TOKEN + "\n")
    script = fi.render(cloud, _values(cloud, token_path=str(token)))
    clean = re.search(r"^ship_clean\(\) \{.*?^\}$", script, flags=re.M | re.S)
    assert clean is not None, "the shipper's filter is gone"
    lines = f"step 1\nloaded token {TOKEN} from the file\nstep 2\n{TOKEN}\n"
    out = subprocess.run(["bash", "-c", f"set -euo pipefail\n{clean[0]}\nship_clean"],
                         input=lines, capture_output=True, text=True, check=True).stdout
    assert out == "step 1\nstep 2\n"
    token.write_text("")  # no token yet (before the boot fetched it): every line goes
    out = subprocess.run(["bash", "-c", f"{clean[0]}\nship_clean"], input="a\nb\n",
                         capture_output=True, text=True, check=True).stdout
    assert out == "a\nb\n"


def test_both_scripts_ship_alike() -> None:
    """The log-shipping block is the same in both boot scripts but for the cloud's copy
    command and how it finds its instance id when the boot failed before reading it."""
    def block(cloud: str) -> list[str]:
        text = fi.TEMPLATES[cloud].read_text()
        body = text.split("# --- log shipping", 1)[1].split("# --- end of log shipping", 1)[0]
        return [ln for ln in body.splitlines()
                if "aws s3 cp" not in ln and "gcloud storage cp" not in ln]
    def parts(lines: list[str]) -> tuple[list[str], list[str]]:  # before ship_id, from ship_exit
        at = [next(i for i, ln in enumerate(lines) if ln.startswith(f"{f}()"))
              for f in ("ship_id", "ship_exit")]
        return lines[:at[0]], lines[at[1]:]
    aws, gcp = parts(block("aws")), parts(block("gcp"))
    assert aws == gcp and len(aws[0]) > 40
