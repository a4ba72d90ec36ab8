"""``python -m provisioner``: the ``provision`` command line, for when the console script is not
on PATH (a virtualenv not activated, ``pip install --user`` without ``~/.local/bin``)."""

import sys

from provisioner.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m provisioner"))
