"""``journalctl`` of a fake instance: ``-u UNIT`` with ``--cursor-file FILE`` (the lines after
the cursor; the cursor is a byte offset into the unit's log here) or ``-n N`` (the last N
lines), ``-o cat``: what the boot's log shipper asks. The unit's output is
$SPOTRING_SANDBOX/journal/<unit>.log (the fake systemctl writes it)."""

import os
import sys
from pathlib import Path


def opt(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def main(argv: list[str]) -> int:
    unit = opt(argv, "-u")
    if unit is None:
        print("journalctl (fake): give -u UNIT", file=sys.stderr)
        return 2
    path = Path(os.environ["SPOTRING_SANDBOX"]) / "journal" / f"{unit}.log"
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    cursor, n = opt(argv, "--cursor-file"), opt(argv, "-n")
    if cursor is not None:
        try:
            start = int(Path(cursor).read_text() or 0)
        except (OSError, ValueError):
            start = 0
        end = data.rfind(b"\n") + 1  # whole lines only
        sys.stdout.buffer.write(data[start:end] if end > start else b"")
        Path(cursor).write_text(str(max(start, end)))
    elif n is not None:
        sys.stdout.buffer.write(b"".join(data.splitlines(keepends=True)[-int(n):]))
    else:
        sys.stdout.buffer.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
