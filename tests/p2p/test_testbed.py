"""The emulated cluster: its plan (no I/O), and real namespaces, bridges and caps.

The real tests build small testbeds under their own name and subnet (never
the default `bs`), and remove them however they end.
"""

from __future__ import annotations

import asyncio
import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2p.testing.localcluster import (
    LocalCluster,
    bootseer_command,
    wait_all_complete,
    write_random_file,
)
from p2p.testing.testbed import netns
from p2p.testing.testbed.plan import MAX_IFNAME, Host, Spec, SpecError, commands, plan
from p2p.units import MiB

NAME, SUBNET = "tq", "10.214.0.0/16"


# ---- the plan -------------------------------------------------------------------------


def test_nodes_are_dealt_to_racks_with_unique_addresses_in_the_subnet() -> None:
    p = plan(Spec(nodes=7, racks=3, name=NAME, subnet=SUBNET))
    assert [n.rack for n in p.nodes] == [0, 1, 2, 0, 1, 2, 0]
    ips = [p.origin.ip, p.host_ip, *(n.ip for n in p.nodes)]
    assert len(set(ips)) == len(ips)
    assert all(ipaddress.IPv4Address(ip) in ipaddress.IPv4Network(SUBNET) for ip in ips)
    names = [*p.namespaces, *p.bridges, *p.uplinks]
    assert len(set(names)) == len(names) and all(len(n) <= MAX_IFNAME for n in names)


def test_every_link_end_is_capped_and_uplinks_follow_oversubscription() -> None:
    p = plan(Spec(nodes=6, racks=2, node_mbps=50, origin_mbps=80, oversubscription=3,
                  name=NAME, subnet=SUBNET))
    assert p.to_dict()["uplink_mbps"] == [50.0, 50.0]  # 3 nodes x 50 / 3
    lines = [line for b in commands(p) if b.tool == "tc" for line in b.lines]
    rate = {line.split()[3]: int(line.split()[7].removesuffix("bit")) // 8 for line in lines}
    assert rate["tq-u0"] == rate["tq-u0c"] == 50_000_000  # both directions of the uplink
    assert rate["tq-origin"] == 80_000_000
    assert rate["tq-n4"] == 50_000_000  # a node's download (the bridge end) ...
    assert sum(1 for b in commands(p) if b.tool == "tc" and b.netns) == 7  # ... and uploads
    explicit = plan(Spec(nodes=6, racks=2, uplink_mbps=10, name=NAME, subnet=SUBNET))
    assert explicit.to_dict()["uplink_mbps"] == [10.0, 10.0]


@pytest.mark.parametrize("spec, match", [
    (Spec(nodes=2, racks=3), "--nodes 2"),
    (Spec(nodes=2, racks=0), "--racks 0"),
    (Spec(nodes=2, node_mbps=0), "--node-cap 0"),
    (Spec(nodes=2, origin_mbps=1e9), "at most 12500"),
    (Spec(nodes=2, name="Bad-Name"), "testbed name"),
    (Spec(nodes=2, subnet="10.0.0.0/24"), "must be a /16"),
    (Spec(nodes=2, subnet="nonsense"), "--subnet 'nonsense'"),
])
def test_bad_specs_say_what_to_change(spec: Spec, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        plan(spec)


# ---- real namespaces -----------------------------------------------------------------


@pytest.fixture
def clean() -> Iterator[None]:
    netns.down(NAME)  # the remains of an earlier, killed run
    try:
        yield
    finally:
        netns.down(NAME)
        assert not netns._our_namespaces(NAME) and not netns._our_links(NAME)


SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen(); s.settimeout(30)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(30); n = 0
while (k := len(c.recv(1 << 20))):
    n += k
print(n, flush=True)
"""
SEND = """
import socket, sys
c = socket.create_connection((sys.argv[1], 9000), timeout=30)
for _ in range(int(sys.argv[2])):
    c.sendall(bytes(1 << 20))
"""


def send_between(bed: netns.Testbed, src: Host, dst: Host, mib: int) -> int:
    """Bytes a TCP sink in `dst` received from `src` (each in its own namespace)."""
    sink = subprocess.Popen(bed.command(dst, [sys.executable, "-c", SINK]),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
        subprocess.run(bed.command(src, [sys.executable, "-c", SEND, dst.ip, str(mib)]),
                       check=True, timeout=60)
        return int(sink.communicate(timeout=60)[0])
    finally:
        sink.kill()


def test_hosts_reach_each_other_across_racks_through_capped_links(clean: None) -> None:
    spec = Spec(nodes=4, racks=2, node_mbps=200, oversubscription=2, name=NAME,
                subnet=SUBNET)
    with netns.testbed(spec) as bed:
        a, b = bed.nodes[0], bed.nodes[1]
        assert (a.rack, b.rack) == (0, 1)
        assert send_between(bed, a, b, 8) == 8 << 20
        assert send_between(bed, bed.nodes[2], bed.origin, 2) == 2 << 20
        inside = subprocess.run(bed.command(a, ["tc", "qdisc", "show", "dev", "eth0"]),
                                capture_output=True, text=True, check=True).stdout
        assert "tbf" in inside and "1600Mbit" in inside  # 200 MB/s up
        uplink = subprocess.run(["tc", "qdisc", "show", "dev", "tq-u0"], capture_output=True,
                                text=True, check=True).stdout
        assert "1600Mbit" in uplink  # 2 nodes x 200 MB/s / 2
        assert netns.find(NAME).plan == bed.plan
        with pytest.raises(netns.TestbedError, match="is up already"):
            netns.up(spec)
    assert not netns._our_namespaces(NAME) and not netns._our_links(NAME)


def test_remains_of_a_failed_up_block_the_next_and_down_clears_them(clean: None) -> None:
    subprocess.run(["ip", "netns", "add", f"{NAME}-n1"], check=True)
    subprocess.run(["ip", "link", "add", f"{NAME}-core", "type", "bridge"], check=True)
    with pytest.raises(netns.TestbedError, match=r"exist.* already"):
        netns.up(Spec(nodes=2, name=NAME, subnet=SUBNET))
    removed = netns.down(NAME)
    assert sorted(removed) == [f"{NAME}-core", f"{NAME}-n1"]
    netns.up(Spec(nodes=2, name=NAME, subnet=SUBNET))  # now it builds


def test_cli_exec_returns_the_status_and_errors_are_one_line(clean: None) -> None:
    def bootseer(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*bootseer_command(), "testbed", *args], capture_output=True,
                              text=True, timeout=120)

    up = bootseer("up", "--nodes", "2", "--name", NAME, "--subnet", SUBNET)
    assert up.returncode == 0, up.stderr
    assert '"tq-n1"' in up.stdout
    done = bootseer("exec", "--name", NAME, "n1", "--", "sh", "-c", "exit 7")
    assert done.returncode == 7
    for args, words in ((("exec", "--name", NAME, "n5", "--", "true"), "no host 'n5'"),
                        (("up", "--nodes", "2", "--name", NAME, "--subnet", SUBNET),
                         "up already"),
                        (("up", "--nodes", "0", "--name", "tr"), "--nodes 0")):
        bad = bootseer(*args)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr
    assert bootseer("down", "--name", NAME).returncode == 0


async def test_a_swarm_runs_on_the_testbed_one_agent_per_node(clean: None,
                                                              tmp_path: Path) -> None:
    spec = Spec(nodes=3, racks=2, node_mbps=200, origin_mbps=200, name=NAME, subnet=SUBNET)
    with netns.testbed(spec) as bed:
        cluster = LocalCluster(tmp_path / "cluster", testbed=bed)
        try:
            await cluster.start_tracker()
            assert cluster.tracker_url.startswith(f"http://{bed.origin.ip}:")
            source = tmp_path / "origin" / "content.bin"
            await asyncio.to_thread(write_random_file, source, 8 * MiB, 5)
            await cluster.start_origin(source.parent)
            m = await cluster.publish(source, 1 * MiB)
            agents = [await cluster.start_agent(i, "ignored") for i in range(3)]
            assert [a.child.ready["addr"].split(":")[0] for a in agents] == \
                [n.ip for n in bed.nodes]
            results = await wait_all_complete(agents, m.content_id, 60)
            assert all(r.get("complete") for r in results.values()), results
            assert await cluster.origin_bytes() >= 8 * MiB
        finally:
            await cluster.stop()
