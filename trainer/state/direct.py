"""Rank 0 writing its snapshot to the run's store itself while the coordinator is away.

Design. Snapshots normally go through the coordinator (its :class:`trainer.state.snapshot.Vault`
holds the store's credentials; workers need none). But the coordinator lives in the daemon,
and while the daemon restarts no snapshot could be kept: a kill of the last holders then sent
the ring back to the snapshot before the outage (225 steps redone per kill in
``benchmarks/chaos.py`` against an interval of ~50). So the coordinator also publishes, next
to when snapshots are due (``snapshot/config``), *where* they are kept, when workers may
write there (:func:`direct_entry`, pure): a directory when the coordinator listens on
loopback (every worker runs on its host, so the folder is theirs too), or any store whose
settings say ``direct=True`` (S3/GCS: the workers then need a put grant under the prefix).
A rank 0 whose upload fails writes the same bytes under the same name to that store with
:class:`DirectWriter`: the data first, then the manifest signed with the same key the vault
uses (derived from the job token), so a restarted coordinator lists and verifies it like its
own (newest valid wins; older ones tried in turn). The writer only writes objects named like
a snapshot under the published prefix, never deletes (the vault forgets the old ones at its
next commit), opens a directory only if it exists already (a worker on another host never
writes to a folder of its own that nobody reads), and decodes nothing it is sent.

Rule for callers: the coordinator puts :func:`direct_entry` in the published config; a worker
builds :meth:`DirectWriter.from_config` from it and hands it to its
:class:`trainer.state.snapshot.Snapshotter`, which uses it only when the coordinator fails.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainer.errors import SnapshotError
from trainer.state.snapshot import (BlobStore, Manifest, SnapshotSettings, is_name, open_store,
                                    put_manifest)

log = logging.getLogger(__name__)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def direct_entry(settings: SnapshotSettings, host: str) -> dict[str, Any] | None:
    """What the coordinator listening on ``host`` publishes so rank 0 can write to the store
    itself (pure): ``{"url", "endpoint_url", "api_endpoint"}`` (a directory as an absolute
    path), or None when workers may not (``settings.direct`` False; unset: only a directory
    with the coordinator on loopback)."""
    u = urlparse(settings.url)
    is_dir = u.scheme in ("", "file")
    allowed = settings.direct if settings.direct is not None else (is_dir and _loopback(host))
    if not allowed:
        return None
    url = str(Path(u.path if u.scheme else settings.url).resolve()) if is_dir else settings.url
    return {"url": url, "endpoint_url": settings.endpoint_url,
            "api_endpoint": settings.api_endpoint}


class DirectWriter:
    """Writes a snapshot to the run's store without the coordinator (see the module
    docstring). Not thread-safe: one per :class:`~trainer.state.snapshot.Snapshotter`."""

    def __init__(self, settings: SnapshotSettings, key: bytes) -> None:
        self.settings, self._key = settings, key
        self._store: BlobStore | None = None

    @classmethod
    def from_config(cls, entry: Any, key: bytes | None) -> DirectWriter | None:
        """The writer the coordinator's published ``direct`` entry allows (None: it allows
        none, the entry is malformed, or there is no key to sign with)."""
        if not isinstance(entry, dict) or not key:
            return None
        try:
            ep, api = entry.get("endpoint_url"), entry.get("api_endpoint")
            s = SnapshotSettings(str(entry["url"]), endpoint_url=None if ep is None else str(ep),
                                 api_endpoint=None if api is None else str(api))
        except (KeyError, ValueError) as e:
            log.warning("the coordinator's snapshot store entry is unusable (%s): snapshots "
                        "go through the coordinator only", e)
            return None
        return cls(s, key)

    def write(self, name: str, data: bytes | memoryview, m: Manifest) -> Manifest:
        """Store ``data`` as snapshot ``name``, then its signed manifest ``m`` (whose size and
        SHA-256 the caller computed from ``data``). Returns the stored manifest. Raises
        :class:`SnapshotError` (the store unreachable, not on this host) or the client's
        error."""
        if not is_name(name) or m.name != name or m.bytes != len(data):
            raise SnapshotError(f"snapshot {name[:80]!r}: not a snapshot of this writer")
        if self._store is None:
            self._store = open_store(self.settings, create=False)
        self._store.put_bytes(name, bytes(data))
        return put_manifest(self._store, m, self._key)
