"""A stand-in worker process for driver and daemon tests (not the trainer).

Usage: python local_worker.py OUTDIR NAME [--ignore-term]. Writes OUTDIR/NAME.started with
its pid and its environment's slowdown, zone and mode; on SIGTERM writes OUTDIR/NAME.noticed
and exits 0 (a drain) unless --ignore-term, in which case it keeps running until killed.
"""

import os
import signal
import sys
import time

out, name = sys.argv[1], sys.argv[2]
ignore = "--ignore-term" in sys.argv


def on_term(signum, frame):
    with open(os.path.join(out, f"{name}.noticed"), "w") as fh:
        fh.write(str(os.getpid()))
    if not ignore:
        sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
# written whole, then renamed: a test that sees NAME.started reads all of it (the file
# opened and read between its creation and its write read as empty on a loaded machine)
with open(os.path.join(out, f"{name}.started.part"), "w") as fh:
    fh.write(f"{os.getpid()} {os.environ.get('SPOTRING_SLOWDOWN')} "
             f"{os.environ.get('SPOTRING_ZONE')} {os.environ.get('SPOTRING_MODE')}")
os.replace(os.path.join(out, f"{name}.started.part"), os.path.join(out, f"{name}.started"))
while True:
    time.sleep(0.05)
