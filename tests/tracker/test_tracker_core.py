"""The tracker's no-I/O core: registry and handout policies, with no sockets and no loop."""

from __future__ import annotations

import ast
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from p2p.configfile import ConfigError
from p2p.content import ContentId, PeerId
from p2p.ratelimit import LogLimiter
from tracker.config import TrackerConfig, load_config
from tracker.handout import HANDOUT_POLICIES, get_policy, rack_aware, uniform
from tracker.index import Candidates, SwarmIndex
from tracker.limits import KeyedRateLimit, ReplayCache
from tracker.machine import Announce, ContentAnnounce, Machine
from tracker.registry import IdentityError, Member, OriginSlot, Registry

C = ContentId("c1")
D = ContentId("c2")


def member(peer: str, rack: str = "r0", have: int = 0, complete: bool = False) -> Member:
    return Member(PeerId(peer), f"10.0.0.1:{7000 + len(peer)}", rack, have, complete, 0.0)


def racks(spec: str) -> Candidates:
    """`racks("r0:3 r1:2")`: 3 members in r0 (r0-000..r0-002), 2 in r1, as candidates."""
    out = []
    for part in spec.split():
        rack, n = part.split(":")
        out += [member(f"{rack}-{i:03d}", rack) for i in range(int(n))]
    return pool(out)


def pool(members: list[Member]) -> Candidates:
    return Candidates(SwarmIndex.of(members))


# -- registry -------------------------------------------------------------------------


def test_members_are_sorted_by_peer_id_whatever_the_announce_order() -> None:
    reg = Registry()
    for p in ["m", "b", "z", "a"]:
        assert reg.announce(C, member(p), now=1.0)
    assert [m.peer for m in reg.members(C)] == ["a", "b", "m", "z"]
    assert reg.members(D) == []


def test_announce_refreshes_a_member_and_stamps_now() -> None:
    reg = Registry()
    assert reg.announce(C, member("a", have=1), now=1.0)
    assert not reg.announce(C, member("a", have=5, complete=True), now=2.0)
    (a,) = reg.members(C)
    assert (a.have, a.complete, a.last_seen) == (5, True, 2.0)


def test_counts_distinct_peers_and_contents() -> None:
    reg = Registry()
    reg.announce(C, member("a"), 1.0)
    reg.announce(D, member("a"), 1.0)
    reg.announce(D, member("b"), 1.0)
    assert (reg.peer_count(), reg.member_count(), reg.contents()) == (2, 3, [C, D])
    assert reg.leave(D, PeerId("a"))
    assert not reg.leave(D, PeerId("a"))
    assert (reg.peer_count(), reg.member_count()) == (2, 2)
    reg.leave(D, PeerId("b"))
    assert (reg.peer_count(), reg.contents()) == (1, [C])


def test_expire_drops_only_silent_members_stalest_first() -> None:
    reg = Registry()
    reg.announce(C, member("a"), 0.0)
    reg.announce(C, member("b"), 1.0)
    reg.announce(D, member("c"), 2.0)
    reg.announce(C, member("a"), 3.0)  # a refreshed: now the freshest
    assert reg.expire(now=11.5, ttl=10.0) == [(C, "b")]
    assert reg.expire(now=12.5, ttl=10.0) == [(D, "c")]
    assert [m.peer for m in reg.members(C)] == ["a"]
    assert reg.contents() == [C]
    assert reg.expire(now=13.5, ttl=10.0) == [(C, "a")]
    assert (reg.peer_count(), reg.content_count()) == (0, 0)


def test_one_reporter_does_not_ban_two_distinct_reporters_do() -> None:
    reg = Registry(ban_seconds=100.0)
    for p in ["bad", "x", "y"]:
        reg.announce(C, member(p), 0.0)
    assert not reg.report(PeerId("bad"), PeerId("x"), "bad chunk 3", 1.0)
    assert not reg.report(PeerId("bad"), PeerId("x"), "bad chunk 4", 2.0)  # same reporter
    assert not reg.report(PeerId("bad"), PeerId("bad"), "self", 2.0)  # ignored
    assert [m.peer for m in reg.candidates(C, 2.0)] == ["bad", "x", "y"]
    assert reg.report(PeerId("bad"), PeerId("y"), "bad chunk 3", 3.0)
    assert reg.banned(3.0) == ["bad"]
    assert [m.peer for m in reg.candidates(C, 3.0)] == ["x", "y"]
    assert [m.peer for m in reg.members(C)] == ["bad", "x", "y"]  # still a member
    assert not reg.is_banned(PeerId("bad"), 103.0)  # the ban runs out
    assert [m.peer for m in reg.candidates(C, 103.0)] == ["bad", "x", "y"]


def test_reports_far_apart_do_not_add_up_to_a_ban() -> None:
    reg = Registry(ban_seconds=10.0)
    reg.report(PeerId("bad"), PeerId("x"), "r", 0.0)
    reg.expire(now=20.0, ttl=5.0)  # forgets the stale report
    assert reg.reports(PeerId("bad")) == []
    assert not reg.report(PeerId("bad"), PeerId("y"), "r", 20.0)
    assert not reg.is_banned(PeerId("bad"), 20.0)


def test_expiry_forgets_only_what_ran_out_and_keeps_a_refreshed_report() -> None:
    reg = Registry(ban_seconds=10.0, reporters_to_ban=2)
    for i in range(50):  # 50 offenders reported once each, a second apart
        reg.report(PeerId(f"bad{i}"), PeerId("x"), "r", float(i))
    reg.report(PeerId("bad0"), PeerId("x"), "again", 40.0)  # refreshed: lasts to 50
    assert reg.report(PeerId("bad49"), PeerId("y"), "r", 49.0)  # banned until 59
    reg.expire(now=45.5, ttl=1e9)
    assert reg.reports(PeerId("bad0")) != [] and reg.reports(PeerId("bad35")) == []
    assert reg.reports(PeerId("bad36")) != []  # reported at 36: runs out after 46
    assert reg.is_banned(PeerId("bad49"), 45.5)
    reg.expire(now=60.0, ttl=1e9)
    assert all(reg.reports(PeerId(f"bad{i}")) == [] for i in range(50))
    assert reg.banned(60.0) == [] and not reg.is_banned(PeerId("bad49"), 60.0)


def test_first_incomplete_announcers_become_origin_fetchers() -> None:
    reg = Registry(origin_fetchers=2)
    assert reg.origin_slot(C, PeerId("a")) == OriginSlot(None, 2, 0)
    reg.announce(C, member("seed", complete=True), 0.0)  # has it all: never appointed
    assert reg.origin_slot(C, PeerId("seed")) == OriginSlot(None, 2, 0)
    reg.announce(C, member("b"), 0.0)
    assert reg.origin_slot(C, PeerId("b")) == OriginSlot(0, 2, 1)  # the modulus is fixed
    for p in ["a", "c"]:
        reg.announce(C, member(p), 0.0)
    slots = {p: reg.origin_slot(C, PeerId(p)) for p in ["a", "b", "c", "seed"]}
    assert slots == {"b": OriginSlot(0, 2, 2), "a": OriginSlot(1, 2, 2),
                     "c": OriginSlot(None, 2, 2), "seed": OriginSlot(None, 2, 2)}


def test_a_departed_fetchers_slot_is_taken_and_refilled() -> None:
    reg = Registry(origin_fetchers=3)
    for p in ["a", "b", "c", "d"]:
        reg.announce(C, member(p), 0.0)
    reg.leave(C, PeerId("a"))
    assert [reg.origin_slot(C, PeerId(p)) for p in "bc"] == [OriginSlot(1, 3, 2),
                                                              OriginSlot(0, 3, 2)]
    reg.announce(C, member("d"), 1.0)  # the next incomplete announcer is appointed
    assert reg.origin_slot(C, PeerId("d")) == OriginSlot(2, 3, 3)
    reg.expire(now=20.0, ttl=10.0)
    assert reg.origin_slot(C, PeerId("d")) == OriginSlot(None, 3, 0)


def test_registry_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        Registry(ban_seconds=0)


# -- handout --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HANDOUT_POLICIES))
def test_never_hands_out_the_requester_and_respects_limit(name: str) -> None:
    policy = get_policy(name)
    members = racks("r0:10 r1:10 r2:10")
    listed = list(members)
    for seed in range(50):
        rng = random.Random(seed)
        requester = listed[seed % len(listed)]
        got = policy(requester.peer, requester.rack, members, 7 + seed % 30, rng)
        assert requester not in got
        assert len(got) == min(7 + seed % 30, len(members) - 1)
        assert len({m.peer for m in got}) == len(got)


@pytest.mark.parametrize("name", sorted(HANDOUT_POLICIES))
def test_same_seed_same_handout(name: str) -> None:
    policy = get_policy(name)
    members = racks("r0:40 r1:40 r2:40 r3:40")
    first = policy(PeerId("r0-000"), "r0", members, 30, random.Random(7))
    assert first == policy(PeerId("r0-000"), "r0", members, 30, random.Random(7))
    assert first != policy(PeerId("r0-000"), "r0", members, 30, random.Random(8))


def test_rack_aware_puts_same_rack_first_up_to_two_thirds() -> None:
    members = racks("r0:50 r1:50 r2:50")
    got = rack_aware(PeerId("r0-000"), "r0", members, 30, random.Random(1))
    assert [m.rack for m in got[:20]] == ["r0"] * 20
    assert Counter(m.rack for m in got) == {"r0": 20, "r1": 5, "r2": 5}


def test_rack_aware_represents_every_other_rack_when_limit_allows() -> None:
    members = racks("r0:50 " + " ".join(f"x{i}:20" for i in range(8)))
    for seed in range(20):
        got = rack_aware(PeerId("r0-000"), "r0", members, 30, random.Random(seed))
        assert {m.rack for m in got} == {"r0"} | {f"x{i}" for i in range(8)}


def test_rack_aware_spreads_over_all_racks_when_racks_outnumber_the_budget() -> None:
    """Ten cross-rack slots, 40 other racks: the peers of r0 together reach every rack."""
    members = racks("r0:32 " + " ".join(f"x{i:02d}:4" for i in range(40)))
    reached: set[str] = set()
    rng = random.Random(3)
    for m in list(members)[:32]:
        got = rack_aware(m.peer, "r0", members, 30, rng)
        assert Counter(g.rack for g in got)["r0"] == 20
        reached |= {g.rack for g in got}
    assert reached == {"r0"} | {f"x{i:02d}" for i in range(40)}


def test_rack_aware_prefers_complete_then_fuller_sources() -> None:
    members = pool([member("a", "r0", have=1), member("b", "r0", have=9),
                    member("c", "r0", have=3, complete=True), member("d", "r0", have=5),
                    member("e", "r1", have=2), member("f", "r1", have=2, complete=True)])
    got = rack_aware(PeerId("a"), "r0", members, 3, random.Random(0))
    assert [m.peer for m in got] == ["c", "b", "f"]


def test_rack_aware_fills_from_other_racks_when_own_rack_is_small() -> None:
    members = racks("r0:3 r1:40")
    got = rack_aware(PeerId("r0-000"), "r0", members, 30, random.Random(0))
    assert [m.rack for m in got[:2]] == ["r0", "r0"]
    assert len(got) == 30


def test_rack_aware_fills_from_own_rack_when_others_are_small() -> None:
    members = racks("r0:40 r1:2")
    got = rack_aware(PeerId("r0-000"), "r0", members, 30, random.Random(0))
    assert Counter(m.rack for m in got) == {"r0": 28, "r1": 2}


def test_zero_limit_and_lone_peer_get_nothing() -> None:
    members = racks("r0:3")
    assert rack_aware(PeerId("r0-000"), "r0", members, 0, random.Random(0)) == []
    alone = racks("r0:1")
    assert uniform(PeerId("r0-000"), "r0", alone, 5, random.Random(0)) == []
    assert rack_aware(PeerId("r0-000"), "r0", alone, 5, random.Random(0)) == []


def test_rack_aware_handles_a_large_swarm() -> None:
    members = racks(" ".join(f"r{i:03d}:32" for i in range(320)))  # 10,240 members
    got = rack_aware(PeerId("r007-000"), "r007", members, 30, random.Random(0))
    assert len(got) == 30
    assert Counter(m.rack for m in got)["r007"] == 20
    assert len({m.rack for m in got}) == 11


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="rack_aware"):
        get_policy("nearest")


# -- core purity ----------------------------------------------------------------------

CORE = ["tracker/registry.py", "tracker/handout.py", "tracker/limits.py", "tracker/index.py"]
ALLOWED_PROJECT = {"p2p.content", "tracker.registry", "tracker.index", "p2p.ratelimit",
                   "p2p.draws"}
FORBIDDEN = {"os", "time", "asyncio", "socket", "threading", "subprocess", "selectors",
             "pathlib", "io", "shutil", "tempfile", "signal", "datetime", "secrets", "uuid"}


@pytest.mark.parametrize("path", CORE)
def test_core_modules_do_no_io_and_use_no_global_random(path: str) -> None:
    tree = ast.parse((Path(__file__).parents[2] / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "random"):
            assert node.attr == "Random", f"{path} uses global random.{node.attr}"
            continue
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if name in ALLOWED_PROJECT or name == "__future__":
                continue
            assert top in sys.stdlib_module_names, f"{path} imports non-stdlib {name}"
            assert top not in FORBIDDEN, f"{path} imports {name}, which does I/O or reads clocks"


# -- config ---------------------------------------------------------------------------


def test_config_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "tracker.toml"
    path.write_text('port = 9000\nhandout_policy = "random"\npeer_ttl_seconds = 20\n')
    config = load_config(str(path), {"port": 9100})
    assert (config.port, config.handout_policy, config.peer_ttl_seconds) == (9100, "random", 20)
    assert config.host == TrackerConfig().host


@pytest.mark.parametrize("text, message", [
    ("prot = 1\n", "unknown key 'prot' in config file"),
    ('port = "7070"\n', "key 'port' in config file .* must be int"),
    ("handout_limit = true\n", "key 'handout_limit'"),
    ('handout_policy = "nearest"\n', "unknown handout_policy 'nearest'.*from"),
    ("port = \n", "not valid TOML"),
])
def test_bad_config_file_names_the_key_and_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tracker.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(str(path), {})
    assert str(path) in str(info.value)


def test_ttl_must_exceed_announce_interval() -> None:
    with pytest.raises(ConfigError, match="peer_ttl_seconds"):
        TrackerConfig(announce_interval_seconds=5.0, peer_ttl_seconds=5.0)


# -- identity, bans by address, fetcher upkeep ----------------------------------------


def at(peer: str, host: str, have: int = 0, complete: bool = False) -> Member:
    return Member(PeerId(peer), f"{host}:7000", "r0", have, complete, 0.0, host)


def test_a_peer_id_is_bound_to_the_host_of_its_first_announce() -> None:
    reg = Registry()
    reg.announce(C, at("a", "10.0.0.1"), 0.0)
    with pytest.raises(IdentityError, match=r"belongs to the node at 10\.0\.0\.1"):
        reg.announce(C, at("a", "10.0.0.2"), 1.0)
    with pytest.raises(IdentityError):
        reg.leave(C, PeerId("a"), "10.0.0.2")
    assert [m.peer for m in reg.members(C)] == ["a"]
    assert reg.leave(C, PeerId("a"), "10.0.0.1")
    reg.announce(C, at("a", "10.0.0.2"), 2.0)  # a member nowhere: free to bind again
    assert reg.bound_host(PeerId("a")) == "10.0.0.2"


def test_reports_count_once_per_reporter_host_and_only_from_members() -> None:
    reg = Registry(ban_seconds=100.0)
    for peer, host in [("bad", "10.0.0.9"), ("x", "10.0.0.1"), ("x2", "10.0.0.1"),
                       ("y", "10.0.0.2")]:
        reg.announce(C, at(peer, host), 0.0)
    with pytest.raises(IdentityError, match="only members may report"):
        reg.report(PeerId("bad"), PeerId("ghost"), "r", 1.0, reporter_host="10.0.0.1")
    with pytest.raises(IdentityError):
        reg.report(PeerId("bad"), PeerId("y"), "r", 1.0, reporter_host="10.0.0.1")
    assert not reg.report(PeerId("bad"), PeerId("x"), "r", 1.0, reporter_host="10.0.0.1")
    assert not reg.report(PeerId("bad"), PeerId("x2"), "r", 1.0, reporter_host="10.0.0.1")
    assert not reg.report(PeerId("x"), PeerId("bad"), "r", 1.0, host="10.0.0.9",
                          reporter_host="10.0.0.9")  # about its own host: ignored
    assert reg.report(PeerId("any-name"), PeerId("y"), "r", 2.0, host="10.0.0.9",
                      reporter_host="10.0.0.2")
    assert reg.banned(2.0) == ["10.0.0.9"]
    reg.announce(C, at("bad-again", "10.0.0.9"), 3.0)  # a new name at the banned host
    assert [m.peer for m in reg.candidates(C, 3.0)] == ["x", "x2", "y"]
    assert reg.origin_slot(C, PeerId("bad-again")).slot is None


def test_reports_count_only_from_reporters_holding_chunks_of_that_content() -> None:
    """Issue 34, finding 3: members holding nothing cannot ban; honest reporters can."""
    reg = Registry(ban_seconds=100.0)
    reg.announce(C, at("honest", "10.0.0.9", have=5), 0.0)
    for peer, host in [("e1", "10.0.0.1"), ("e2", "10.0.0.2")]:
        reg.announce(C, at(peer, host), 0.0)  # members of C holding nothing
        assert not reg.report(PeerId("honest"), PeerId(peer), "bad chunk 3", 1.0,
                              reporter_host=host, content=C)
    reg.announce(D, at("e3", "10.0.0.3", have=4), 0.0)  # holds chunks, of another content
    assert not reg.report(PeerId("honest"), PeerId("e3"), "bad chunk 3", 1.0,
                          reporter_host="10.0.0.3", content=C)
    assert reg.banned(1.0) == [] and reg.reports("10.0.0.9") == []
    assert [r.reason for _, r in reg.recent_reports()][-2:] == [
        "bad chunk 3 (not counted: the reporter has announced no chunk of that content)",
        "bad chunk 3 (not counted: the reporter is not a member of that content)"]
    reg.announce(C, at("x", "10.0.0.4", have=2), 1.0)
    reg.announce(C, at("y", "10.0.0.5", complete=True), 1.0)
    assert not reg.report(PeerId("honest"), PeerId("x"), "bad chunk 3", 2.0,
                          reporter_host="10.0.0.4", content=C)
    assert reg.report(PeerId("honest"), PeerId("y"), "bad chunk 4", 2.0,
                      reporter_host="10.0.0.5", content=C)
    assert reg.banned(2.0) == ["10.0.0.9"]


def test_the_reporters_needed_grow_with_the_swarm_up_to_a_cap() -> None:
    reg = Registry(ban_seconds=100.0)
    for i in range(100):
        reg.announce(C, at(f"p{i}", f"10.0.1.{i}", have=1), 0.0)
    assert (reg.reporters_needed(C), reg.reporters_needed(D), reg.reporters_needed(None)) \
        == (6, 2, 2)  # 100 members // 16; an empty content and no content: the floor
    for i in range(1, 6):
        assert not reg.report(PeerId("p0"), PeerId(f"p{i}"), "bad", 1.0,
                              reporter_host=f"10.0.1.{i}", content=C)
    assert reg.report(PeerId("p0"), PeerId("p6"), "bad", 1.0, reporter_host="10.0.1.6",
                      content=C)
    for i in range(100, 1000):
        reg.announce(C, at(f"p{i}", f"10.1.{i // 200}.{i % 200}"), 0.0)
    assert reg.reporters_needed(C) == 8


def test_a_fetcher_without_progress_loses_its_slot_until_it_progresses() -> None:
    reg = Registry(origin_fetchers=1, fetcher_stall_seconds=10.0)
    reg.announce(C, at("slow", "10.0.0.1"), 0.0)
    reg.announce(C, at("b", "10.0.0.2"), 0.0)
    assert reg.origin_slot(C, PeerId("slow")).slot == 0
    reg.announce(C, at("slow", "10.0.0.1", have=1), 9.0)  # progress: the clock restarts
    reg.announce(C, at("b", "10.0.0.2"), 19.0)
    assert reg.origin_slot(C, PeerId("slow")).slot == 0
    reg.announce(C, at("b", "10.0.0.2"), 19.5)  # 10.5 s since its last progress
    assert reg.origin_slot(C, PeerId("b")) == OriginSlot(0, 1, 1)
    assert reg.origin_slot(C, PeerId("slow")).slot is None
    assert reg.fetchers_reassigned == 1
    reg.leave(C, PeerId("b"))
    reg.announce(C, at("slow", "10.0.0.1", have=1), 20.0)  # no progress: not re-appointed
    assert reg.origin_slot(C, PeerId("slow")).slot is None
    reg.announce(C, at("slow", "10.0.0.1", have=2), 21.0)
    assert reg.origin_slot(C, PeerId("slow")).slot == 0


def test_ten_squatting_addresses_cost_an_honest_fetcher_two_start_windows_at_most() -> None:
    """Issue 34, finding 7, on virtual time: 10 fake members at 10 addresses announce every
    0.3 s holding nothing (each also under a second peer id); an honest node announces
    every 2 s and gains a chunk at each announce while it holds a slot."""
    start, interval = 3.0, 2.0
    reg = Registry(origin_fetchers=8, fetcher_stall_seconds=10.0, fetcher_start_seconds=start)
    fakes = [(f"fake{i}{tag}", f"10.9.0.{i}") for i in range(10) for tag in ("", "-b")]
    honest_have, honest_slot_at, last_fake_slot_at = 0, None, 0.0
    for step in range(300):  # 30 s in steps of 0.1 s
        now = step / 10
        if step % 3 == 0:
            for peer, host in fakes:
                reg.announce(C, at(peer, host), now)
        if step % 20 == 5:
            reg.announce(C, at("honest", "10.0.0.1", have=honest_have), now)
            if reg.origin_slot(C, PeerId("honest")).slot is not None:
                honest_slot_at = now if honest_slot_at is None else honest_slot_at
                honest_have += 1
        fetchers = reg.fetchers(C)
        nodes = [reg.member(C, f).node for f in fetchers]  # type: ignore[union-attr]
        assert len(set(nodes)) == len(nodes), fetchers  # one slot per node, whatever its ids
        if any(f.startswith("fake") for f in fetchers):
            last_fake_slot_at = now
    assert honest_slot_at is not None and honest_slot_at <= start + interval + 0.5
    assert last_fake_slot_at <= 2 * (start + 0.3), last_fake_slot_at  # two windows, then none
    assert reg.fetchers(C) == ["honest"]


def test_an_unreachable_fetcher_is_replaced_but_not_banned() -> None:
    reg = Registry(origin_fetchers=1)
    reg.announce(C, at("far", "10.0.0.1"), 0.0)
    reg.announce(C, at("b", "10.0.0.2"), 0.0)
    assert reg.fetcher_unreachable(C, PeerId("far"))
    assert not reg.fetcher_unreachable(C, PeerId("far"))
    reg.announce(C, at("b", "10.0.0.2"), 1.0)
    assert reg.origin_slot(C, PeerId("b")).slot == 0
    assert reg.banned(1.0) == []
    assert [m.peer for m in reg.candidates(C, 1.0)] == ["b", "far"]


# -- limits ---------------------------------------------------------------------------


def test_replay_cache_refuses_a_mac_twice_and_forgets_it_once_stale() -> None:
    cache = ReplayCache(skew_seconds=300.0)
    assert cache.check(b"a" * 32, 1000.0, 1000.0) is None
    assert "replayed" in (cache.check(b"a" * 32, 1000.0, 1100.0) or "")
    assert cache.check(b"b" * 32, 1000.5, 1100.0) is None
    assert len(cache) == 2
    assert cache.check(b"c" * 32, 1400.0, 1302.0) is None  # 1000's bucket expires
    assert len(cache) == 1


def test_a_full_replay_cache_raises_its_floor_instead_of_forgetting() -> None:
    cache = ReplayCache(skew_seconds=300.0, max_entries=2)
    for i, stamp in enumerate([1000.0, 1001.0, 1002.0]):
        assert cache.check(bytes([i]) * 32, stamp, 1002.0) is None
    assert len(cache) == 2
    assert "older than the replay cache's horizon" in (cache.check(b"\0" * 32, 1000.0, 1002.0)
                                                       or "")


def test_keyed_rate_limit_refuses_beyond_the_burst_and_forgets_idle_keys() -> None:
    limit = KeyedRateLimit(rate_per_second=2.0, burst=3)
    assert [limit.take("a", 0.0) for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    assert limit.take("b", 0.0) == 0.0
    assert limit.take("a", 0.5) == 0.0
    limit.take("c", 10.0)
    assert len(limit) == 1  # a and b were full again, so forgotten


def test_log_limiter_lets_one_line_through_per_period_and_counts_the_rest() -> None:
    logs = LogLimiter(every_s=10.0)
    assert logs.allow("x", 0.0) == 0
    assert logs.allow("x", 1.0) is None
    assert logs.allow("y", 1.0) == 0
    assert logs.allow("x", 2.0) is None
    assert logs.allow("x", 10.0) == 2


# -- the swarm index handouts draw from -----------------------------------------------


class CountingRandom(random.Random):
    """Counts the random draws a policy makes: its work, without a clock."""

    draws = 0

    def random(self) -> float:
        self.draws += 1
        return super().random()

    def getrandbits(self, k: int) -> int:
        self.draws += 1
        return super().getrandbits(k)


def big_swarm(nodes: int, per_rack: int = 40) -> Registry:
    reg = Registry()
    for n in range(nodes):
        reg.announce(C, member(f"n{n:05d}", f"r{n // per_rack:04d}", have=n % 97,
                               complete=n % 5 == 0), 0.0)
    return reg


@pytest.mark.parametrize("name", sorted(HANDOUT_POLICIES))
def test_handout_work_does_not_grow_with_the_swarm(name: str) -> None:
    policy = get_policy(name)
    draws = []
    for nodes in (400, 12_000):
        reg, rng = big_swarm(nodes), CountingRandom(5)
        for n in range(0, 400, 7):
            policy(PeerId(f"n{n:05d}"), f"r{n // 40:04d}", reg.candidates(C, 0.0), 30, rng)
        draws.append(rng.draws)
    assert draws[1] < 1.3 * draws[0], draws


def test_index_matches_a_brute_force_model_under_churn() -> None:
    rng = random.Random(9)
    reg, model = Registry(), {}
    for step in range(3000):
        peer = PeerId(f"p{rng.randrange(60)}")
        if rng.random() < 0.2:
            reg.leave(C, peer)
            model.pop(peer, None)
        else:
            m = member(peer, f"r{rng.randrange(4)}", rng.randrange(9), rng.random() < 0.3)
            reg.announce(C, m, float(step))
            model[peer] = m
        if step % 100 == 0:
            index = reg.candidates(C, float(step)).index
            assert sorted(index.by_peer) == sorted(model)
            for rack in {m.rack for m in model.values()}:
                group = index.rack(rack)
                assert group is not None
                want = {p for p, m in model.items() if m.rack == rack and m.complete}
                assert sorted(group.complete.items) == sorted(want)
            assert index.rack_names == sorted({m.rack for m in model.values()})


def test_banned_members_are_skipped_by_every_draw() -> None:
    reg = Registry(ban_seconds=100.0)
    for p in ["bad", "x", "y", "z"]:
        reg.announce(C, member(p, complete=p == "bad"), 0.0)
    reg.report(PeerId("bad"), PeerId("x"), "r", 1.0)
    reg.report(PeerId("bad"), PeerId("y"), "r", 1.0)
    for policy in HANDOUT_POLICIES.values():
        for seed in range(20):
            got = policy(PeerId("x"), "r0", reg.candidates(C, 2.0), 5, random.Random(seed))
            assert sorted(m.peer for m in got) == ["y", "z"]


def test_same_announces_same_index_same_handouts() -> None:
    first = [m.peer for m in rack_aware(PeerId("n00007"), "r0000",
                                        big_swarm(2000).candidates(C, 0.0), 30,
                                        random.Random(1))]
    again = [m.peer for m in rack_aware(PeerId("n00007"), "r0000",
                                        big_swarm(2000).candidates(C, 0.0), 30,
                                        random.Random(1))]
    assert first == again and len(first) == 30


def test_a_stopped_reply_is_the_callers_own() -> None:
    """Each stopped content's reply is a new dict: a caller that changes one (adding the
    interval, say) changes no other reply."""
    machine = Machine(Registry(), rack_aware, 10.0)
    stop = (ContentAnnounce(ContentId("c1"), 0, False, 5, "stopped"),)
    first = machine.apply(Announce(PeerId("a"), "10.0.0.1", "10.0.0.1:1", "r0", stop), 1.0,
                          random.Random(1))
    first[ContentId("c1")]["peers"].append("changed")
    first[ContentId("c1")]["interval"] = 30
    again = machine.apply(Announce(PeerId("b"), "10.0.0.2", "10.0.0.2:1", "r0", stop), 2.0,
                          random.Random(1))
    assert again[ContentId("c1")] == {"peers": [], "origin_slot": None, "origin_slots": 1,
                                      "origin_filled": 1}
