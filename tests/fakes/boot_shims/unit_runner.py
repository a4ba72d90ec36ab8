"""The supervisor of one unit of a fake instance (started by the fake systemctl): runs its
ExecStart as its User=, restarts it per Restart=on-failure, and records each run's pid and exit
code in the unit's state file (for tests). Usage: unit_runner.py SPEC.json"""

import grp
import json
import os
import pwd
import subprocess
import sys
import time

spec = json.loads(open(sys.argv[1]).read())
user = pwd.getpwnam(spec["user"])
gid = grp.getgrnam(spec["group"]).gr_gid
env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, **spec["env"]}
runs = []


def demote() -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(user.pw_uid)


def record() -> None:
    with open(spec["state"] + ".tmp", "w") as fh:
        json.dump({"runs": runs}, fh)
    os.replace(spec["state"] + ".tmp", spec["state"])


while True:
    proc = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=env, preexec_fn=demote,
                            stdin=subprocess.DEVNULL)
    runs.append({"pid": proc.pid, "rc": None, "started": time.time()})
    record()
    rc = proc.wait()
    runs[-1]["rc"] = rc
    record()
    print(f"unit_runner: {spec['unit']}: exited {rc}", flush=True)
    if spec["restart"] != "on-failure" or rc == 0 or rc in spec["prevent"]:
        break
    time.sleep(spec["restart_s"])
