"""Other hosts for real: Linux network namespaces joined to this one by veth pairs.

Design: :meth:`Netns.create` makes namespace ``name`` and a veth pair, gives the host end
``host_addr`` and the namespace end ``ns_addr`` (a /24 of the test's own choosing, used for
nothing else) and brings both up, with loopback inside. :meth:`Netns.run` runs a command
inside; :meth:`Netns.destroy` removes the namespace (its veth end goes with it). Optionally
``rate`` limits the host end's egress with ``tc qdisc tbf`` (netem is not available here).

:class:`Zones` makes several *zones*: a namespace per zone, with two links. The **control
link** is a veth pair to this host (``10.213.<base+1+z>.1`` here, ``.2`` inside, the default
route); the coordinator listens on zone 0's gateway (:attr:`Zones.gateway`) and every zone
reaches it through its own. The **data link** joins the zones to each other through a bridge
in a hub namespace (zone ``z`` is ``10.213.<base>.<10+z>``, the address its workers' gloo
listens on: ``--ring-host``); with ``rate`` it is shaped by ``tc tbf`` in both directions,
the slow cross-zone link. Workers of one zone share its namespace and reach each other
inside it (fast); :meth:`Zones.egress_bytes` counts what left a zone over the data link
(the kernel's own counter), the figure of cross-zone traffic. :func:`enter` moves the
calling process into a namespace (a forked worker, before it opens any socket).

Rule for callers: only the namespaces' own addresses are ever targeted; destroy what you
create (a ``finally``). Where namespaces cannot be made (no root, no ``ip``), :meth:`create`
raises :class:`NetnsUnavailable` with the reason, for ``pytest.skip``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here (the message says why)."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@dataclass
class Netns:
    name: str
    host_if: str
    host_addr: str
    ns_addr: str

    @classmethod
    def create(cls, name: str, *, host_addr: str, ns_addr: str,
               rate: str | None = None) -> Netns:
        """Make the namespace and its link; ``rate`` (e.g. ``"50mbit"``) shapes the link."""
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
        _ip("netns", "del", name)  # a leftover of a crashed run
        r = _ip("netns", "add", name)
        if r.returncode != 0:
            raise NetnsUnavailable(f"cannot create a network namespace: {r.stderr.strip()}")
        host_if, ns_if = f"{name}-h"[:15], f"{name}-n"[:15]
        ns = cls(name, host_if, host_addr, ns_addr)
        try:
            for args in (("link", "add", host_if, "type", "veth", "peer", "name", ns_if),
                         ("link", "set", ns_if, "netns", name),
                         ("addr", "add", f"{host_addr}/24", "dev", host_if),
                         ("link", "set", host_if, "up"),
                         ("-n", name, "addr", "add", f"{ns_addr}/24", "dev", ns_if),
                         ("-n", name, "link", "set", ns_if, "up"),
                         ("-n", name, "link", "set", "lo", "up")):
                r = _ip(*args)
                if r.returncode != 0:
                    raise NetnsUnavailable(f"ip {' '.join(args)}: {r.stderr.strip()}")
            if rate is not None:
                r = subprocess.run(["tc", "qdisc", "add", "dev", host_if, "root", "tbf",
                                    "rate", rate, "burst", "32kbit", "latency", "50ms"],
                                   capture_output=True, text=True, timeout=30)
                if r.returncode != 0:
                    raise NetnsUnavailable(f"tc tbf: {r.stderr.strip()}")
        except BaseException:
            ns.destroy()
            raise
        return ns

    def run(self, argv: list[str], timeout: float = 60) -> str:
        """Run ``argv`` inside the namespace; returns its stdout (raises on a bad exit)."""
        r = subprocess.run(["ip", "netns", "exec", self.name, *argv], capture_output=True,
                           text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{argv[0]} in {self.name} exited {r.returncode}: "
                               f"{r.stderr[-2000:]}")
        return r.stdout

    def popen(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kw)  # type: ignore[call-overload]

    def destroy(self) -> None:
        _ip("link", "del", self.host_if)
        _ip("netns", "del", self.name)


def _run_ok(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(argv)}: {r.stderr.strip()}")


def enter(name: str) -> None:
    """Move this (single-threaded) process into namespace ``name``. Raises ``OSError``."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class Zones:
    """Zones joined by a shaped data link, each with a control link to this host (module
    docstring). ``names[z]`` is zone ``z``'s namespace."""

    tag: str
    base: int
    names: list[str] = field(default_factory=list)
    hub: str = ""

    @property
    def gateway(self) -> str:
        """This host's address on zone 0's control link: where the coordinator listens."""
        return f"10.213.{self.base + 1}.1"

    def data_addr(self, zone: int) -> str:
        """Zone ``zone``'s address on the data link (its workers' ``--ring-host``)."""
        return f"10.213.{self.base}.{10 + zone}"

    @classmethod
    def create(cls, tag: str, zones: int, *, base: int = 60, rate: str | None = None
               ) -> Zones:
        """Make ``zones`` zones (``tag``: at most 6 characters, names the namespaces and
        links; ``base``: the third octet of the data link, the control links above it)."""
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise NetnsUnavailable("the `ip` and `tc` commands (iproute2) are not installed")
        if not 0 < len(tag) <= 6 or not 1 <= zones <= 8 or not 1 <= base <= 240:
            raise ValueError(f"tag={tag!r}, zones={zones}, base={base}: out of range")
        z = cls(tag, base, hub=f"{tag}hub")
        # leftovers of a crashed run: the host ends first (deleted at once, with their peers;
        # a deleted namespace frees its links later, and a new link of the same name fails)
        for i in range(8):
            _ip("link", "del", f"{tag}c{i}h")
        for name in [z.hub, *(f"{tag}z{i}" for i in range(8))]:
            _ip("netns", "del", name)
        try:
            _run_ok(["ip", "netns", "add", z.hub])
        except NetnsUnavailable as e:
            raise NetnsUnavailable(f"cannot create a network namespace: {e}") from None
        try:
            _run_ok(["ip", "-n", z.hub, "link", "add", "br0", "type", "bridge"])
            _run_ok(["ip", "-n", z.hub, "link", "set", "br0", "up"])
            for i in range(zones):
                z._add_zone(i, rate)
        except BaseException:
            z.destroy()
            raise
        return z

    def _add_zone(self, i: int, rate: str | None) -> None:
        ns, t = f"{self.tag}z{i}", self.tag
        _run_ok(["ip", "netns", "add", ns])
        self.names.append(ns)
        ctl_h, ctl_n, dat_n, dat_h = f"{t}c{i}h", f"{t}c{i}n", f"{t}d{i}n", f"{t}d{i}h"
        gw = f"10.213.{self.base + 1 + i}.1"
        for argv in (
                ["link", "add", ctl_h, "type", "veth", "peer", "name", ctl_n],
                ["link", "set", ctl_n, "netns", ns],
                ["addr", "add", f"{gw}/24", "dev", ctl_h],
                ["link", "set", ctl_h, "up"],
                ["-n", ns, "addr", "add", f"10.213.{self.base + 1 + i}.2/24", "dev", ctl_n],
                ["-n", ns, "link", "set", ctl_n, "up"],
                ["-n", ns, "link", "set", "lo", "up"],
                ["-n", ns, "route", "add", "default", "via", gw],
                ["link", "add", dat_n, "type", "veth", "peer", "name", dat_h],
                ["link", "set", dat_n, "netns", ns],
                ["link", "set", dat_h, "netns", self.hub],
                ["-n", self.hub, "link", "set", dat_h, "master", "br0"],
                ["-n", self.hub, "link", "set", dat_h, "up"],
                ["-n", ns, "addr", "add", f"{self.data_addr(i)}/24", "dev", dat_n],
                ["-n", ns, "link", "set", dat_n, "up"]):
            _run_ok(["ip", *argv])
        if rate is not None:
            for where, dev in ((ns, dat_n), (self.hub, dat_h)):
                _run_ok(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                         rate, "burst", "32kbit", "latency", "400ms"])

    def argv(self, zone: int, argv: list[str]) -> list[str]:
        """``argv`` run inside zone ``zone``."""
        return ["ip", "netns", "exec", self.names[zone], *argv]

    def egress_bytes(self, zone: int) -> int:
        """Bytes that left zone ``zone`` over the data link so far."""
        out = subprocess.run(["ip", "netns", "exec", self.names[zone], "cat",
                              f"/sys/class/net/{self.tag}d{zone}n/statistics/tx_bytes"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return int(out.strip())

    def data_bytes(self) -> int:
        """Bytes over the data link so far (each counted once, as it left its zone)."""
        return sum(self.egress_bytes(z) for z in range(len(self.names)))

    def destroy(self) -> None:
        for i, ns in enumerate(self.names):
            _ip("link", "del", f"{self.tag}c{i}h")
            _ip("netns", "del", ns)
        _ip("netns", "del", self.hub)
