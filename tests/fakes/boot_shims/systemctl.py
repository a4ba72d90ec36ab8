"""``systemctl`` of a fake instance: ``daemon-reload``, ``enable --now UNIT...``, and
``is-failed --quiet UNIT`` / ``show -p ExecMainStatus --value UNIT`` (from the supervisor's
record: failed once it ended with a non-zero code it does not restart) only.

``enable --now`` reads each unit from /etc/systemd/system (a template ``name@.service`` for
``name@i.service``, with ``%i``/``%I``/``%%`` replaced), and starts a supervisor
(unit_runner.py) that runs its ExecStart as User=/Group= in WorkingDirectory=, with its
Environment= and nothing of the caller's environment but the instance's network (the proxy to
its metadata server), restarting it as Restart=/RestartSec=/RestartPreventExitStatus= say. The
unit's output goes to $SPOTRING_SANDBOX/journal/<unit>.log.
"""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

UNITS = Path("/etc/systemd/system")
NETWORK = ("http_proxy", "no_proxy", "HTTP_PROXY", "NO_PROXY")


def parse(unit: str) -> dict:
    name, _, suffix = unit.rpartition(".")
    prefix, at, instance = name.partition("@")
    path = UNITS / (f"{prefix}@.{suffix}" if at else unit)
    if at and (UNITS / unit).exists():
        path = UNITS / unit
    section, keys = "", {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service" and "=" in line:
            k, _, v = line.partition("=")
            v = v.replace("%%", "\0").replace("%i", instance).replace("%I", instance)
            keys.setdefault(k.strip(), []).append(v.replace("\0", "%"))
    return keys


def last_run(unit: str) -> tuple[dict | None, dict]:
    """The unit's last run ({pid, rc, started}; None before any) and its spec."""
    units = Path(os.environ["SPOTRING_SANDBOX"]) / "units"
    try:
        runs = json.loads((units / f"{unit}.json").read_text())["runs"]
        spec = json.loads((units / f"{unit}.spec.json").read_text())
    except (OSError, ValueError, KeyError):
        return None, {}
    return (runs[-1] if runs else None), spec


def failed(unit: str) -> bool:
    run, spec = last_run(unit)
    if run is None or run["rc"] in (None, 0):
        return False
    return spec.get("restart") != "on-failure" or run["rc"] in spec.get("prevent", [])


def main(argv: list[str]) -> int:
    if argv[:1] == ["daemon-reload"]:
        return 0
    if argv[:1] == ["is-failed"]:
        return 0 if failed(argv[-1]) else 1
    if argv[:1] == ["show"] and "ExecMainStatus" in argv:
        run, _ = last_run(argv[-1])
        print(run["rc"] if run and run["rc"] is not None else 0)
        return 0
    if argv[:2] != ["enable", "--now"]:
        print(f"systemctl (fake): unsupported: {' '.join(argv)}", file=sys.stderr)
        return 1
    root = Path(os.environ["SPOTRING_SANDBOX"])
    (root / "journal").mkdir(exist_ok=True)
    (root / "units").mkdir(exist_ok=True)
    for unit in argv[2:]:
        keys = parse(unit)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        env.update({k: os.environ[k] for k in NETWORK if k in os.environ})
        for line in keys.get("Environment", []):
            for item in shlex.split(line):
                k, _, v = item.partition("=")
                env[k] = v
        spec = {"unit": unit, "argv": shlex.split(keys["ExecStart"][-1]),
                "user": keys.get("User", ["root"])[-1], "group": keys.get("Group", ["root"])[-1],
                "cwd": keys.get("WorkingDirectory", ["/"])[-1], "env": env,
                "restart": keys.get("Restart", ["no"])[-1],
                "restart_s": float(keys.get("RestartSec", ["0.1"])[-1]),
                "prevent": [int(c) for c in " ".join(keys.get("RestartPreventExitStatus", []))
                            .split()],
                "state": str(root / "units" / f"{unit}.json")}
        spec_path = root / "units" / f"{unit}.spec.json"
        spec_path.write_text(json.dumps(spec))
        journal = open(root / "journal" / f"{unit}.log", "ab")
        subprocess.Popen([sys.executable, str(Path(__file__).with_name("unit_runner.py")),
                          str(spec_path)], stdin=subprocess.DEVNULL, stdout=journal,
                         stderr=subprocess.STDOUT, start_new_session=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
