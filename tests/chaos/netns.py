"""Network namespaces for the nodes that can be cut off: one veth link each, made and removed by the run.

Each namespaced node gets one veth pair carrying three small subnets (10.213-215.X.0/30), one per
path: ``redis`` (the node's workers reach Redis at the host end), ``store`` (an S3 proxy at the
host end) and ``ctl`` (the run reads its simulator's counters; never cut). Only these links and
loopback carry traffic: nothing is routed to or from any other interface.

A cut is silent, as a real partition is: both ends get a bogus neighbour (ARP) entry for the
other end's address on that path, so packets are sent to a MAC nobody has and vanish; open
connections see no reset, just silence, until the cut heals and TCP retransmits. Needs root
(``ip netns``, ``ip link``, ``ip neigh``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from dataclasses import dataclass

PATHS = ("redis", "store", "ctl")
_OCTET2 = {"redis": 213, "store": 214, "ctl": 215}
_BOGUS_MAC = "02:00:00:00:de:ad"


class NetError(RuntimeError):
    """An ``ip`` command failed."""


def ip(*args: str, netns: str | None = None) -> str:
    argv = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


def available() -> str:
    """'' when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        ip("netns", "list")
    except (NetError, FileNotFoundError) as exc:
        return f"`ip netns` does not work here: {exc}"
    return ""


@dataclass
class Link:
    """One namespaced node's link: the namespace, its veth pair and the addresses of each path."""

    netns: str
    host_dev: str
    ns_dev: str
    octet: int  # the third octet of this link's subnets

    def host_ip(self, path: str) -> str:
        return f"10.{_OCTET2[path]}.{self.octet}.1"

    def ns_ip(self, path: str) -> str:
        return f"10.{_OCTET2[path]}.{self.octet}.2"

    def exec_prefix(self) -> list[str]:
        """Run a command inside the namespace: prefix its argv with this."""
        return ["ip", "netns", "exec", self.netns]


class NetLab:
    """Creates the namespaces and links of one run, cuts and heals paths, removes everything."""

    def __init__(self, tag: str) -> None:
        self.tag = tag  # a few characters unique to the run: names stay under 15 characters
        self.links: dict[str, Link] = {}
        self.cut: set[tuple[str, str]] = set()

    def add(self, node: str) -> Link:
        index = len(self.links) + 1
        octet = _free_octet({link.octet for link in self.links.values()})
        link = Link(f"dfc-{self.tag}-{index}", f"dfc{self.tag}{index}h", f"dfc{self.tag}{index}n", octet)
        ip("netns", "add", link.netns)
        self.links[node] = link
        ip("link", "add", link.host_dev, "type", "veth", "peer", "name", link.ns_dev)
        ip("link", "set", link.ns_dev, "netns", link.netns)
        for path in PATHS:
            ip("addr", "add", f"{link.host_ip(path)}/30", "dev", link.host_dev)
            ip("addr", "add", f"{link.ns_ip(path)}/30", "dev", link.ns_dev, netns=link.netns)
        ip("link", "set", link.host_dev, "up")
        ip("link", "set", link.ns_dev, "up", netns=link.netns)
        ip("link", "set", "lo", "up", netns=link.netns)
        return link

    def cut_path(self, node: str, path: str) -> None:
        """Silently drop every packet of ``path`` between the host and ``node``, both ways."""
        link = self.links[node]
        bogus = ("lladdr", _BOGUS_MAC, "nud", "permanent", "dev")
        ip("neigh", "replace", link.host_ip(path), *bogus, link.ns_dev, netns=link.netns)
        ip("neigh", "replace", link.ns_ip(path), *bogus, link.host_dev)
        self.cut.add((node, path))

    def heal_path(self, node: str, path: str) -> None:
        link = self.links[node]
        with contextlib.suppress(NetError):
            ip("neigh", "del", link.host_ip(path), "dev", link.ns_dev, netns=link.netns)
        with contextlib.suppress(NetError):
            ip("neigh", "del", link.ns_ip(path), "dev", link.host_dev)
        self.cut.discard((node, path))

    def heal_all(self) -> None:
        for node, path in sorted(self.cut):
            self.heal_path(node, path)

    def remove(self) -> list[str]:
        """Delete every namespace and link of the run; returns what could not be deleted."""
        problems: list[str] = []
        for link in self.links.values():
            with contextlib.suppress(NetError):
                ip("link", "del", link.host_dev)  # deletes its peer too
            try:
                ip("netns", "del", link.netns)
            except NetError as exc:
                problems.append(str(exc))
        return problems

    def leftovers(self) -> list[str]:
        """Namespaces and links of this run that still exist."""
        names = [f"dfc-{self.tag}-", f"dfc{self.tag}"]
        found = [line.split()[0] for line in ip("netns", "list").splitlines() if line.startswith(names[0])]
        for line in ip("-o", "link", "show").splitlines():
            dev = line.split(":")[1].strip().split("@")[0]
            if dev.startswith(names[1]):
                found.append(dev)
        return found


def _free_octet(taken: set[int]) -> int:
    """A third octet whose 10.213-215.X.0/30 subnets no interface here uses yet."""
    used = set(taken)
    for line in ip("-o", "-4", "addr", "show").splitlines():
        addr = ipaddress.ip_interface(line.split()[3]).ip
        first, second, third, _ = addr.packed
        if first == 10 and second in _OCTET2.values():
            used.add(third)
    for octet in range(1, 255):
        if octet not in used:
            return octet
    raise NetError("no free 10.213-215.X.0/30 subnet left")
