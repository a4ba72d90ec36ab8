"""Another host for real: a Linux network namespace joined to this one by a veth pair.

Design: :meth:`Netns.create` makes namespace ``name`` and a veth pair, gives the host end
``host_addr`` and the namespace end ``ns_addr`` (a /24 of the test's own choosing, used for
nothing else) and brings both up, with loopback inside. :meth:`Netns.run` runs a command
inside; :meth:`Netns.destroy` removes the namespace (its veth end goes with it). Optionally
``rate`` limits the host end's egress with ``tc qdisc tbf`` (netem is not available here).

Rule for callers: only the namespaces' own addresses are ever targeted; destroy what you
create (a ``finally``). Where namespaces cannot be made (no root, no ``ip``), :meth:`create`
raises :class:`NetnsUnavailable` with the reason, for ``pytest.skip``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


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
