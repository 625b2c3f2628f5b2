"""An emulated cluster on one machine, as a plan: names, addresses, links and caps.

Theory of operation
-------------------
`bootseer testbed up` turns a `Spec` into network namespaces joined by Linux
bridges, the way a small data centre is wired:

    origin ns ──veth── core bridge ──veth (rack uplink)── rack bridge ──veth── node ns

- one namespace per node (`<name>-n<i>`), with `lo` and an `eth0` whose other
  end sits on its rack's bridge (`<name>-r<r>`);
- one uplink per rack: a veth pair from the rack bridge to the core bridge
  (`<name>-core`), the link between racks that a real fabric oversubscribes;
- one `<name>-origin` namespace on the core bridge, for the registry, HDFS
  and the tracker (the origin side of a launch);
- the core bridge itself carries the host's address, so processes started on
  the host (a test, a benchmark driver) reach every namespace, uncapped.

Every address is in one /16 (one broadcast domain: no routes to set up). Node
`i` of rack `r` is `A.B.(r+1).(k+1)` (`k`: its place in the rack), the origin
is `A.B.0.1` and the host `A.B.255.254`. Nodes are dealt to racks round robin.

Caps are token-bucket filters (`tc qdisc ... tbf`) on the sending end of each
veth, so each direction of a link is capped on its own: a node's `eth0` caps
its upload, the bridge end caps its download; the uplink's two ends cap what
leaves and what enters the rack. The uplink cap defaults to the rack's total
node cap divided by `oversubscription` (1: non-blocking).

This module does no I/O. `commands` gives the `ip` and `tc` batches that build
the plan (see `p2p.testing.testbed.netns` for running them, and for removal).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_IFNAME = 15  # Linux interface names: IFNAMSIZ - 1
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]{0,3}")
MAX_RACKS = 250
MAX_PER_RACK = 250
MAX_MBPS = 12_500.0  # 100 Gbps: tc's token bucket takes no more
BURST_SECONDS = 0.01  # a bucket holds 10 ms of traffic ...
MIN_BURST_BYTES = 64 * 1024  # ... but never less than this
QUEUE_LATENCY_MS = 20  # how long a packet may wait in a bucket's queue


class SpecError(ValueError):
    """A testbed that cannot be built as asked; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Spec:
    """What to build. Caps in MB/s (10^6 bytes), each direction of a link."""

    nodes: int
    racks: int = 1
    node_mbps: float = 100.0
    origin_mbps: float = 200.0
    oversubscription: float = 1.0
    uplink_mbps: float | None = None  # None: the rack's node caps / oversubscription
    name: str = "bs"
    subnet: str = "10.213.0.0/16"

    def check(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise SpecError(f"testbed name {self.name!r}: 1-4 lower-case letters and digits, "
                            "starting with a letter")
        if not 1 <= self.racks <= MAX_RACKS:
            raise SpecError(f"--racks {self.racks}: between 1 and {MAX_RACKS}")
        if not self.racks <= self.nodes <= self.racks * MAX_PER_RACK:
            raise SpecError(f"--nodes {self.nodes}: at least one per rack ({self.racks}) and "
                            f"at most {MAX_PER_RACK} per rack")
        for flag, value in (("--node-cap", self.node_mbps), ("--origin-cap", self.origin_mbps),
                            ("--oversubscription", self.oversubscription),
                            ("--uplink-cap", self.uplink_mbps)):
            if value is not None and not 0 < value <= MAX_MBPS:
                raise SpecError(f"{flag} {value:g}: must be > 0 and at most {MAX_MBPS:g} "
                                "(MB/s; oversubscription: a ratio)")
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as exc:
            raise SpecError(f"--subnet {self.subnet!r}: {exc}") from None
        if net.prefixlen != 16:
            raise SpecError(f"--subnet {self.subnet}: must be a /16 (e.g. 10.213.0.0/16)")

    def rack_uplink_mbps(self, rack_nodes: int) -> float:
        if self.uplink_mbps is not None:
            return self.uplink_mbps
        return rack_nodes * self.node_mbps / self.oversubscription


@dataclass(frozen=True, slots=True)
class Host:
    """A namespace of the testbed: a node, or the origin."""

    netns: str
    ip: str
    rack: int | None  # None: the origin


@dataclass(frozen=True, slots=True)
class Batch:
    """Lines for one `ip -batch -` or `tc -batch -` run, in `netns` (None: the host)."""

    tool: str  # "ip" or "tc"
    netns: str | None
    lines: tuple[str, ...]

    def argv(self) -> list[str]:
        return [self.tool, *(["-n", self.netns] if self.netns else []), "-batch", "-"]


@dataclass(frozen=True, slots=True)
class Plan:
    spec: Spec
    nodes: tuple[Host, ...]
    origin: Host
    host_ip: str
    bridges: tuple[str, ...]  # core first
    uplinks: tuple[str, ...]  # the rack-side end of each uplink veth pair

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.origin.netns, *(n.netns for n in self.nodes))

    def to_dict(self) -> dict[str, object]:
        s = self.spec
        return {"name": s.name, "subnet": s.subnet, "racks": s.racks,
                "node_mbps": s.node_mbps, "origin_mbps": s.origin_mbps,
                "uplink_mbps": [s.rack_uplink_mbps(self.rack_size(r)) for r in range(s.racks)],
                "host_ip": self.host_ip,
                "origin": {"netns": self.origin.netns, "ip": self.origin.ip},
                "nodes": [{"netns": n.netns, "ip": n.ip, "rack": n.rack} for n in self.nodes]}

    def rack_size(self, rack: int) -> int:
        return sum(1 for n in self.nodes if n.rack == rack)


def in_namespace(netns: str, argv: Sequence[str]) -> list[str]:
    """`argv` run in network namespace `netns`, and in every other respect on the host.

    `nsenter --net`, not `ip netns exec`: the latter also gives the command a mount
    namespace of its own with a fresh /sys, which hides the cgroup mount runc needs
    and keeps the command's FUSE mounts from the host."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]


def plan(spec: Spec) -> Plan:
    """Names and addresses for `spec` (checked; SpecError if it cannot be built)."""
    spec.check()
    base = int(ipaddress.IPv4Network(spec.subnet).network_address)
    per_rack = [0] * spec.racks
    nodes = []
    for i in range(spec.nodes):
        rack = i % spec.racks
        per_rack[rack] += 1
        nodes.append(Host(f"{spec.name}-n{i}", _ip(base, rack + 1, per_rack[rack]), rack))
    bridges = (f"{spec.name}-core", *(f"{spec.name}-r{r}" for r in range(spec.racks)))
    uplinks = tuple(f"{spec.name}-u{r}" for r in range(spec.racks))
    out = Plan(spec, tuple(nodes), Host(f"{spec.name}-origin", _ip(base, 0, 1), None),
               _ip(base, 255, 254), bridges, uplinks)
    for name in (*out.namespaces, *bridges, *uplinks, *(_core_end(u) for u in uplinks)):
        assert len(name) <= MAX_IFNAME, name  # the name pattern and limits keep them short
    return out


def commands(p: Plan) -> list[Batch]:
    """The batches that build `p`, in order (namespaces must exist: `ip netns add` each)."""
    s, core = p.spec, p.bridges[0]
    host = [f"link add {b} type bridge" for b in p.bridges]
    host += [f"link set {b} up" for b in p.bridges]
    host.append(f"addr add {p.host_ip}/16 dev {core}")
    host_tc = []
    for rack, uplink in enumerate(p.uplinks):
        far = _core_end(uplink)
        host += [f"link add {uplink} type veth peer name {far}",
                 f"link set {uplink} master {p.bridges[rack + 1]}", f"link set {far} master {core}",
                 f"link set {uplink} up", f"link set {far} up"]
        mbps = s.rack_uplink_mbps(p.rack_size(rack))
        host_tc += [_tbf(uplink, mbps), _tbf(far, mbps)]
    inside = []
    for h in (p.origin, *p.nodes):
        bridge = core if h.rack is None else p.bridges[h.rack + 1]
        mbps = s.origin_mbps if h.rack is None else s.node_mbps
        host += [f"link add {h.netns} type veth peer name eth0 netns {h.netns}",
                 f"link set {h.netns} master {bridge}", f"link set {h.netns} up"]
        host_tc.append(_tbf(h.netns, mbps))  # into the namespace: its download
        inside += [Batch("ip", h.netns, ("link set lo up", f"addr add {h.ip}/16 dev eth0",
                                         "link set eth0 up")),
                   Batch("tc", h.netns, (_tbf("eth0", mbps),))]  # out of it: its upload
    return [Batch("ip", None, tuple(host)), Batch("tc", None, tuple(host_tc)), *inside]


def _core_end(uplink: str) -> str:
    return uplink + "c"


def _ip(base: int, third: int, fourth: int) -> str:
    return str(ipaddress.IPv4Address(base + (third << 8) + fourth))


def _tbf(dev: str, mbps: float) -> str:
    rate = mbps * 1e6
    burst = max(int(rate * BURST_SECONDS), MIN_BURST_BYTES)
    return (f"qdisc add dev {dev} root tbf rate {int(rate * 8)}bit burst {burst} "
            f"latency {QUEUE_LATENCY_MS}ms")
