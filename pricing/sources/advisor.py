"""The AWS Spot Advisor's interruption bands as a hazard source.

Design: the file edge of :func:`pricing.risk.estimate`'s third basis: a Spot Advisor CSV
(``snapshot_date,region,os,instance_type,interruption_bucket,...``, gzip or plain) becomes
``{(region, instance_type): hazard_per_hour}`` through the pure
:func:`pricing.risk.advisor_hazard`.

Rule: a bad header or bucket raises TraceFormatError naming the file and line.
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

from pricing.errors import TraceFormatError
from pricing.risk import advisor_hazard


def load_spot_advisor(path: str | Path, os_name: str = "Linux") -> dict[tuple[str, str], float]:
    """Read a Spot Advisor CSV (``snapshot_date,region,os,instance_type,interruption_bucket,
    ...``) into ``{(region, instance_type): hazard_per_hour}`` for ``os_name`` rows.

    Raises TraceFormatError naming file and line for a bad header or bucket.
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    out: dict[tuple[str, str], float] = {}
    try:
        with opener(p, "rt", encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            need = {"region", "os", "instance_type", "interruption_bucket"}
            if not need <= set(reader.fieldnames or ()):
                raise TraceFormatError(str(p), 1, f"not a Spot Advisor file: needs columns {sorted(need)}")
            for line, row in enumerate(reader, start=2):
                if row["os"] != os_name:
                    continue
                try:
                    band = int(row["interruption_bucket"])
                    out[(row["region"], row["instance_type"])] = advisor_hazard(band)
                except (ValueError, KeyError):
                    raise TraceFormatError(str(p), line, f"interruption_bucket "
                                           f"{row['interruption_bucket']!r} must be 0..4") from None
    except OSError as exc:
        raise TraceFormatError(str(p), None, f"cannot read: {exc}") from None
    return out
