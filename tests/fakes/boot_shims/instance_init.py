"""pid 1 of a fake instance (tests/fakes/instances.py), in its own mount and PID namespaces.

It bind-mounts the instance's own /etc (a copy), /opt, /var/lib and the image's Python, runs
the boot script as cloud-init or google-startup-scripts would (as root, its output in the
instance's log, its exit code kept), then reaps orphans until the instance is killed: when it
dies the kernel kills every process of the namespace, as a VM's processes go with the VM.

Usage: instance_init.py SPEC.json
"""

import json
import os
import subprocess
import sys
import time

spec = json.loads(open(sys.argv[1]).read())
for src, dst in spec["mounts"]:
    os.makedirs(dst, exist_ok=True)
    subprocess.run(["mount", "--bind", src, dst], check=True)
subprocess.run(["ldconfig"], check=True)  # this instance's /etc/ld.so.cache: the image's libs
with open(spec["log"], "ab") as log:
    boot = subprocess.Popen(["/bin/bash", spec["script"]], env=spec["env"], cwd="/",
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.5)
        continue
    if pid == boot.pid:
        code = os.waitstatus_to_exitcode(status)
        with open(spec["rc"] + ".tmp", "w") as fh:
            fh.write(str(code))
        os.replace(spec["rc"] + ".tmp", spec["rc"])
