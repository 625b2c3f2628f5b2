"""One simulation run: the real swarm cores and tracker policy, driven on virtual time.

Theory of operation
-------------------
This is the simulator's equivalent of the agent's `_execute`: it feeds each
node's `Swarm` the events an agent would (tracker answers, peers joining,
haves, chunks arriving, connections lost, timers) and carries out the
actions the swarm returns as scheduled callbacks and network flows:

| action              | what happens                                             |
|---------------------|----------------------------------------------------------|
| Connect(p)          | after one latency, each side hears the other's Join (or   |
|                     | PeerLost): one step for the agent's dial and Join exchange |
| Request(p, c)       | once the node's download cap (if any) has room for it,    |
|                     | after one latency, a place in p's uploads (one piece at a |
|                     | time per link, `upload_slots` per node; p must hold c),   |
|                     | then a flow; ChunkArrived(c, p) when its last byte lands  |
|                     | (a relay, if p is still fetching c: simulations.node)     |
| FetchFromOrigin(c)  | the same pacing, the origin latency, a slot in the        |
|                     | origin's queue, then a flow; ChunkArrived(c, None), or    |
|                     | ChunkFailed if the origin is down                         |
| Advertise(c)        | PeerHas (PeerPending) to every connected peer, one batch  |
| Withdraw(c)         | PeerWithdrew to every connected peer, one batch           |
| Cancel(p, c)        | not sent if still paced (its budget comes back); else,    |
|                     | unless `if_unsent` (a time-out), a cancel travels to p,   |
|                     | which skips the request if it has not started sending it; |
|                     | a piece sent anyway counts as wasted bytes                |
| Disconnect(p)       | the other side drops the join at once and hears PeerLost  |
|                     | one latency later; their transfers stop                   |
| Report / Complete / Abort | counted / completion time / failure recorded        |

Each node also runs the agent's node core (`p2p.swarm.node.Node`), and
every swarm event goes through it (`swarm_event`), which calls the swarm
and returns its actions tagged with the content. Who is joined for each
content is the core's join table (p2p.swarm.links), as in the agent: a Join
heard (`JoinHeard`, on a "link" named by the other node's index) joins the
peer and tells the swarm, a Disconnect drops it, and haves go to the peers
it lists. The sim's Join exchange is one step, so it carries out no
`SendJoin` of its own. The core decides when the
node announces and what each content asks of the tracker: an `AnnounceAll`
is answered at once by the simulated tracker, each content's answer going to
its swarm as `PeersFound`; a `Leave` (a content aborted) removes the node
from that swarm at the tracker. The core hears when a peer joins one of the
node's swarms, and sees a content complete in its swarm's actions.

Timers: a node's wake-ups serve its core and all its swarms. After every
call into the core, one is scheduled at the core's `next_timer()` if that is
earlier than every one pending; one that comes before anything is due runs
nothing and re-arms, and one pending for a deadline that an earlier wake-up
has moved keeps its place instead of being scheduled again. The
core asks a swarm for its next timer only when it must, and never takes one
further than `TIMER_SLACK_S` ahead (simulations.node gives it as the core's
`timer_slack_s`): that keeps `Swarm.next_timer`, which costs O(peers), off
the path of most events.

The run ends when every live node holds everything, or stops with a reason:
no chunk arrived anywhere for `stall_after_s` of virtual time (e.g. every
source is dead), nothing is left to happen, or virtual time passed
`max_time_s`.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from typing import assert_never

from p2p.content import ContentId, PeerId
from p2p.swarm import Swarm
from p2p.swarm.events import (
    Abort,
    Action,
    Advertise,
    Cancel,
    ChunkArrived,
    ChunkFailed,
    Complete,
    Connect,
    Disconnect,
    Event,
    FetchFromOrigin,
    PeerHas,
    PeerLost,
    PeerPending,
    PeerWithdrew,
    PrefetchGiven,
    Report,
    Request,
    Withdraw,
)
from p2p.swarm.links import CloseLinks, Dial, JoinHeard, LinkId, ReportUnreachable, SendJoin
from p2p.swarm.node import (
    AnnounceAll,
    Announced,
    AnnounceItem,
    Leave,
    NodeAction,
    NodeEvent,
    Pin,
    SwarmActions,
    Unpin,
    WakeReaders,
)
from p2p.swarm.uploads import request_rank
from simulations.cpu import CpuPool
from simulations.engine import Loop
from simulations.network import Flows, Links, Origin, Topology
from simulations.node import (
    ORIGIN,
    PACED,
    RELAYING,
    SENDING,
    TAILING,
    TRAVELLING,
    SimNode,
    Transfer,
)
from simulations.scenario import Scenario
from simulations.strategy import get_strategy
from simulations.tracker import SimTracker
from simulations.workload import Plan, plan


class Simulation:
    skip_redundant_haves = True  # see _fan_out; tests compare runs with and without

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.strategy = get_strategy(scenario.strategy, scenario.swarm_overrides)
        self.loop = Loop()
        self.top = Topology(scenario.network, scenario.nodes, scenario.agent.upload_cap_Bps,
                            scenario.agent.burst_bytes)
        self.flows = Flows(self.top, self.loop)
        self.origins = [Origin(i, o) for i, o in enumerate(scenario.network.origins)]
        rng = random.Random(f"{scenario.seed}/workload")
        names = {o.name: i for i, o in enumerate(scenario.network.origins)}
        self.plan: Plan = plan(scenario.workload, scenario.nodes, names, rng)
        self.contents = self.plan.contents
        self._hot_mask = [sum(1 << c for c in content.hot) for content in self.contents]
        self.tracker = SimTracker(scenario.tracker, self.strategy.handout,
                                  random.Random(f"{scenario.seed}/tracker"))
        interval = scenario.tracker.announce_interval_s
        cap = scenario.agent.download_cap_Bps
        line = scenario.network.nic_down_Bps if cap is None \
            else min(cap, scenario.network.nic_down_Bps)
        self._order = scenario.agent.upload_order
        self.nodes = [SimNode(i, self.top.rack_of[i], self.plan.needs[i], self.plan.start_s[i],
                              self.plan.fail_s[i], interval, scenario.agent, self._rank, line)
                      for i in range(scenario.nodes)]
        self._index = {node.peer: node.index for node in self.nodes}
        self._content_index = {content.id: c for c, content in enumerate(self.contents)}
        # held[c][chunk * nodes + n]: node n's swarm holds `chunk` of content c, or has
        # finished. Lets `_fan_out` skip haves that cannot change what a swarm does.
        self._held = [bytearray(content.chunks * scenario.nodes) for content in self.contents]
        # Transfers in flight by `_key`, and by network flow (a flow id is a slot index).
        self._transfers: dict[int, Transfer] = {}
        self._by_flow: list[Transfer | None] = []
        self._key_contents = len(self.contents)
        self._key_nodes = scenario.nodes + 1  # senders: the nodes and ORIGIN
        self._key_chunks = max((content.chunks for content in self.contents), default=1)
        # `_chunk_key` (sender, content, chunk) -> relays waiting for the sender's fetch
        # to end
        self._relays: dict[int, list[Transfer]] = {}
        # `_chunk_key` (sender, content, chunk) -> cut-through relays of a chunk the sender
        # fetches from a peer (simulations.node.TAILING)
        self._cut: dict[int, list[Transfer]] = {}
        self.unfinished = scenario.nodes  # live nodes that still lack something
        self.last_progress = 0.0
        # The loop's lanes (simulations.engine) for what comes one latency later.
        self._same_rack = self.loop.lane(scenario.network.same_rack_latency_s)
        self._cross_rack = self.loop.lane(scenario.network.cross_rack_latency_s)
        self._control = self._cross_rack  # haves, withdrawals, lost joins
        self.ready = 0
        self.egress_curve: list[tuple[int, float]] = []  # (nodes ready, origin bytes so far)
        self._pools: dict[int, CpuPool] = {}  # node index (or -1: shared) -> its CPU
        self._cpu_jobs = 0

    @property
    def events_delivered(self) -> int:
        """Swarm calls made so far (events and timers), by every node."""
        return sum(node.core.swarm_calls for node in self.nodes)

    # ---- running ----------------------------------------------------------------

    def run(self, progress: tuple[int, Callable[[], None]] | None = None) -> str:
        """Run to the end; returns why it ended ("complete" or a stop reason)."""
        for node in self.nodes:
            self.loop.at(node.start_s, self._join, node.index)
            if node.fail_s is not None:
                self.loop.at(max(node.fail_s, node.start_s), self._fail, node.index)
        self.loop.at(self.scenario.stall_after_s / 4, self._watch)
        # A run makes no reference cycles (tests/simulations/test_sim.py checks), so reference
        # counting frees everything; the cyclic collector would only rescan millions
        # of live objects (7% of a 10,000-node run).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.loop.run(until=self.scenario.max_time_s, every=progress)
        finally:
            if collecting:
                gc.enable()
        if self.unfinished == 0 and self._cpu_jobs == 0:
            return "complete"
        if self.loop.stopped is None:
            self.loop.stopped = (f"nothing left to happen at t={self.loop.now:.1f} s with "
                                 f"{self.unfinished} live nodes incomplete")
        return self.loop.stopped

    def _watch(self, _: object) -> None:
        if self.unfinished == 0:
            return
        idle = self.loop.now - self.last_progress
        if idle >= self.scenario.stall_after_s:
            down = [o.spec.name for o in self.origins if not o.up(self.loop.now)]
            why = f"; origins down: {', '.join(down)}" if down else ""
            self.loop.stop(f"cannot finish: {self.unfinished} live nodes still lack chunks and "
                           f"no chunk arrived for {idle:.0f} s of virtual time{why}")
            return
        self.loop.after(self.scenario.stall_after_s / 4, self._watch)

    # ---- node life ----------------------------------------------------------------

    def _join(self, n: int) -> None:
        node = self.nodes[n]
        if node.fail_s is not None and node.fail_s <= self.loop.now:
            self.unfinished -= 1  # failed before it started: it never counts
            return
        node.alive = True
        now, cfg = self.loop.now, self.strategy.swarm
        for c in node.needs:
            content = self.contents[c]
            rng = random.Random(f"{self.scenario.seed}/{n}/{c}")
            swarm = Swarm(node.peer, node.rack, content.chunks, [False] * content.chunks,
                          content.chunk_size, cfg, rng, now)
            node.swarms[c] = swarm
            node.origin_pending[c] = 0
            if self.strategy.prefetch and content.hot:
                node.hot_left[c] = len(content.hot)
            node.core.add(content.id, swarm, now)
        if self.strategy.uses_tracker:
            self._node_do(node, node.core.handle_timer(now))  # the first announce is due now
        for c in node.needs:
            if self.strategy.uses_tracker:
                if c in node.hot_left:
                    self._deliver(n, c, PrefetchGiven(self.contents[c].hot))
            else:
                self._node_do(node, node.core.start(self.contents[c].id, now))
        self._arm(node)

    def _rank(self, transfer: Transfer) -> int:
        """A request's rank for its sender's upload slots (p2p.swarm.uploads): the due
        its receiver gave it, or the chunks its receiver holds."""
        swarm = self.nodes[transfer.dst].swarms.get(transfer.content)
        held = 0 if swarm is None else swarm.have.bit_count()
        return request_rank(self._order, held, transfer.due_ms)

    # ---- the node core: announces --------------------------------------------------

    def _node_do(self, node: SimNode, actions: list[NodeAction]) -> None:
        """Carry out the node core's actions (its swarms' among them). The caller then
        re-arms the node's timer (`_arm`)."""
        for action in actions:
            if type(action) is SwarmActions:  # most of them: skip the match
                self._execute(node.index, self._content_index[action.content], action.actions)
                continue
            match action:
                case AnnounceAll(items):
                    # Without a tracker, the announce goes unanswered: the core waits
                    # for the answer for good, and announces no more.
                    if self.strategy.uses_tracker:
                        self._announce_all(node, items)
                case Leave(content):
                    if self.strategy.uses_tracker:
                        self.tracker.leave(content, node.peer)
                case WakeReaders():
                    pass  # simulated nodes have no readers: hot lists stand for them
                case Pin() | Unpin():
                    pass  # nor a store that evicts
                case SendJoin():
                    pass  # the Join exchange is one step here (_connect)
                case Dial() | ReportUnreachable() | CloseLinks():
                    raise AssertionError(f"the simulator opens no links: {action!r}")
                case SwarmActions():
                    pass  # carried out above
                case _:
                    assert_never(action)

    def _arm(self, node: SimNode) -> None:
        """Schedule a wake-up for the node if its core's next timer is earlier than every
        one pending.

        Called after every call into the core that may have moved its timer. After a
        swarm call that kept it (`Node.timer_kept`) it is not: the last `_arm` saw the
        same timer and left a wake-up at it or earlier, and a wake-up that runs is
        followed by an `_arm` of its own, so this one would schedule nothing."""
        when = node.core.next_timer()
        wakes = node.wakes  # (each earlier than the one before: the last is the earliest)
        if when is not None and (not wakes or when < wakes[-1]):
            wakes.append(when)
            self.loop.at(when, self._wake, (node.index, when))

    def _wake(self, arg: tuple[int, float]) -> None:
        n, when = arg
        node = self.nodes[n]
        wakes = node.wakes
        if wakes[-1] == when:  # (nearly always: the earliest runs first, bar ties in time)
            wakes.pop()
        else:
            wakes.remove(when)
        if node.alive:
            self._node_do(node, node.core.handle_timer(self.loop.now))
            self._arm(node)

    def _core_event(self, node: SimNode, event: NodeEvent) -> None:
        self._node_do(node, node.core.handle(event, self.loop.now))
        self._arm(node)

    def _announce_all(self, node: SimNode, items: tuple[AnnounceItem, ...]) -> None:
        """The tracker answers at once; each content's answer goes to its swarm (a
        complete one ignores it), then the core hears that the announce is done."""
        now, limit = self.loop.now, self.scenario.tracker.handout_limit
        states = [(i.content, i.have, i.complete, limit if i.want is None else i.want)
                  for i in items]
        handed_out: list[PeerId] = []
        for item, found in zip(items, self.tracker.announce(node.peer, node.rack, states, now),
                               strict=True):
            handed_out += [hint.peer for hint in found.peers]
            if not item.complete:
                self._deliver(node.index, self._content_index[item.content], found)
        node.core.handle(Announced(self.scenario.tracker.announce_interval_s,
                                   tuple(handed_out)), now)

    def _fail(self, n: int) -> None:
        node = self.nodes[n]
        if not node.alive:
            return
        node.alive = False
        if node.complete_s is None:
            self.unfinished -= 1
        for transfer in node.in_flight():
            self._abort(transfer)
        node.uploads = node.uploads.cleared()
        for c in node.swarms:
            content = self.contents[c].id
            for q in node.core.links.joined_links(content):
                self.nodes[q].core.links.drop(content, node.peer)
                node.core.links.drop(content, self.nodes[q].peer)
                self.loop.after_lane(self._control, self._lost, (q, c, n))
            self.loop.after(self.scenario.tracker.peer_ttl_s, self._forget, (n, c))
        self._maybe_done()

    def _forget(self, arg: tuple[int, int]) -> None:
        n, c = arg
        self.tracker.leave(self.contents[c].id, self.nodes[n].peer)

    def _lost(self, arg: tuple[int, int, int]) -> None:
        q, c, n = arg
        self._deliver(q, c, PeerLost(self.nodes[n].peer, "connection reset"))

    def _lane(self, a: int, b: int) -> int:
        """The loop's lane for what goes from node a to node b (Topology.latency)."""
        rack_of = self.top.rack_of
        return self._same_rack if rack_of[a] == rack_of[b] else self._cross_rack

    # ---- calling the swarm --------------------------------------------------------

    def _deliver(self, n: int, c: int, event: Event) -> None:
        node = self.nodes[n]
        if not node.alive:
            return
        actions = node.core.swarm_event(self.contents[c].id, event, self.loop.now)
        if actions:
            self._node_do(node, actions)
            self._arm(node)
        elif not node.core.timer_kept:  # (read at once: `_node_do` may call the core again)
            self._arm(node)

    def _execute(self, n: int, c: int, actions: list[Action]) -> None:
        for action in actions:
            kind = type(action)
            if kind is Request:
                assert isinstance(action, Request)
                self._request(n, c, self._index[action.peer], action.chunk)
            elif kind is Advertise:
                assert isinstance(action, Advertise)
                self._advertise(n, c, action)
            elif kind is Cancel:
                assert isinstance(action, Cancel)
                self._cancel(n, c, action)
            elif kind is FetchFromOrigin:
                assert isinstance(action, FetchFromOrigin)
                self._fetch_origin(n, c, action.chunk)
            elif kind is Connect:
                assert isinstance(action, Connect)
                p = self._index[action.peer]
                self.loop.after_lane(self._lane(n, p), self._connect, (n, c, p))
            else:
                self._execute_rare(n, c, action)

    def _execute_rare(self, n: int, c: int, action: Action) -> None:
        node = self.nodes[n]
        match action:
            case Complete():
                self._completed(node, c)
            case Disconnect(peer, _):
                self._disconnect(n, c, self._index[peer])
            case Report(peer, reason):
                node.counters.reports += 1
                self.tracker.report(peer, node.peer, reason, self.loop.now)
            case Abort():  # the core removes the content (Leave)
                node.counters.aborts += 1
                self._finish(node, c)
            case Withdraw(chunk):  # a fetch failed: take the pending mark back
                event = PeerWithdrew(node.peer, chunk)
                self.loop.after_lane(self._control, self._fan_out, (n, c, event, -1))
                for relayed in self._take_relays(self._cut, self._chunk_key(n, c, chunk)):
                    if not relayed.cancelled:
                        self._abort(relayed)
                        self._relay_failed(relayed)
            case _:
                raise AssertionError(f"unexpected action {action!r}")

    # ---- connections --------------------------------------------------------------

    def _connect(self, arg: tuple[int, int, int]) -> None:
        n, c, p = arg
        node, other = self.nodes[n], self.nodes[p]
        if not node.alive:
            return
        if not other.alive or c not in other.swarms:
            self._deliver(n, c, PeerLost(other.peer, "connection refused"))
            return
        content = self.contents[c].id
        if node.core.links.joined(content, other.peer):
            return  # the other side connected first; both swarms already know
        self._core_event(node, self._join_of(other, c, content, p))
        if other.alive and node.alive:
            self._core_event(other, self._join_of(node, c, content, n))

    def _join_of(self, sender: SimNode, c: int, content: ContentId, link: int) -> JoinHeard:
        """The Join `sender` sends for content `c`, heard on `link`."""
        have, pending = sender.swarms[c].join_view()
        return JoinHeard(content, sender.peer, LinkId(link), sender.rack, have, pending)

    def _disconnect(self, n: int, c: int, p: int) -> None:
        node, other = self.nodes[n], self.nodes[p]
        # n's core dropped p when its swarm said Disconnect; p drops n at once too (a
        # join is symmetric here), and hears why one latency later.
        if not other.core.links.drop(self.contents[c].id, node.peer):
            return
        for transfer in [t for t in node.in_flight() if t.content == c and p in (t.dst, t.src)]:
            self._abort(transfer)
        self.loop.after_lane(self._lane(n, p), self._lost, (p, c, n))

    def _advertise(self, n: int, c: int, action: Advertise) -> None:
        peer = self.nodes[n].peer
        event: Event = PeerPending(peer, action.chunk) if action.pending else \
            PeerHas(peer, action.chunk)
        skip = action.chunk if self.skip_redundant_haves else -1
        self.loop.after_lane(self._control, self._fan_out, (n, c, event, skip))

    def _fan_out(self, arg: tuple[int, int, Event, int]) -> None:
        """One have (pending, withdrawal) to every connected peer: `_deliver`, inlined.

        Most swarm calls of a big run come through here, so two kinds of
        receiver are not called. A swarm that has finished ignores every event
        and has no timer. And a have (or pending mark) of a chunk the receiver
        already holds changes only the receiver's count of that chunk's
        holders, which the swarm consults for chunks it lacks and never for one
        it holds (no request, no origin fetch, no deadline depends on it; a
        swarm drops every pending mark of a chunk when it gets the chunk, and
        records none after). `skip` is that chunk, or -1 to deliver to all.
        tests/simulations/test_sim.py checks that skipping changes no result;
        `skip_redundant_haves = False` turns it off.
        """
        n, c, event, skip = arg
        nodes = self.nodes
        if not nodes[n].alive:
            return
        now, content = self.loop.now, self.contents[c].id
        held, base = self._held[c], skip * len(nodes)
        for q in nodes[n].core.links.joined_links(content):
            if skip >= 0 and held[base + q]:
                continue
            other = nodes[q]
            # (a finished swarm's chunks are all marked held: `_finish`)
            if (skip < 0 and c in other.finished) or not other.alive:
                continue
            actions = other.core.swarm_event(content, event, now)
            if actions:
                self._node_do(other, actions)
                self._arm(other)
            elif not other.core.timer_kept:  # (else `_arm` would schedule nothing: see there)
                self._arm(other)

    # ---- transfers -----------------------------------------------------------------

    def _key(self, n: int, c: int, p: int, chunk: int) -> int:
        """The key of node n's transfer of `chunk` of content c from p (or ORIGIN)."""
        return ((n * self._key_contents + c) * self._key_nodes + p + 1) * self._key_chunks \
            + chunk

    def _chunk_key(self, n: int, c: int, chunk: int) -> int:
        """The key of node n's `chunk` of content c in `_relays` and `_cut`."""
        return (n * self._key_contents + c) * self._key_chunks + chunk

    def _take_relays(self, relays: dict[int, list[Transfer]], key: int) -> list[Transfer]:
        """`relays.pop(key, [])`, in calls a compiled build makes natively."""
        found = relays.get(key)
        if found is None:
            return []
        del relays[key]
        return found

    def _track(self, transfer: Transfer) -> None:
        self._transfers[transfer.key] = transfer
        transfer.tracked = True
        self.nodes[transfer.dst].track(transfer)
        if transfer.src != ORIGIN:
            self.nodes[transfer.src].track(transfer)

    def _untrack(self, transfer: Transfer) -> None:
        key = transfer.key
        if self._transfers.get(key) is transfer:
            del self._transfers[key]
        transfer.tracked = False
        if transfer.flow >= 0:
            self._by_flow[transfer.flow] = None

    def _request(self, n: int, c: int, p: int, chunk: int) -> None:
        key = self._key(n, c, p, chunk)
        if key in self._transfers:
            return  # already on its way: the swarm asked twice
        nbytes = self.contents[c].chunk_bytes(chunk)
        transfer = Transfer(n, c, p, chunk, nbytes, key=key)
        self._track(transfer)
        node = self.nodes[n]
        node.counters.requests += 1
        wait = 0.0 if node.download is None else node.download.reserve(nbytes, self.loop.now)
        if wait > 0:
            transfer.stage = PACED
            self.loop.after(wait, self._request_paced, transfer)
        else:
            self._request_sent(transfer)

    def _request_paced(self, transfer: Transfer) -> None:
        """The download budget has room: the request goes out, unless cancelled meanwhile."""
        if not transfer.cancelled:
            self._request_sent(transfer)

    def _unpace(self, transfer: Transfer) -> None:
        """A request that waited for download budget will not go out: the budget comes back
        (p2p.link, `Link.cancel`)."""
        download = self.nodes[transfer.dst].download
        if download is not None:
            download.refund(transfer.nbytes, self.loop.now)

    def _request_sent(self, transfer: Transfer) -> None:
        """The request leaves its node, carrying the node's due (p2p.swarm.uploads)."""
        transfer.stage = TRAVELLING
        transfer.due_ms = int(1000 * self.nodes[transfer.dst].core.due(self.loop.now))
        self.loop.after_lane(self._lane(transfer.dst, transfer.src), self._request_arrived,
                             transfer)

    def _request_arrived(self, transfer: Transfer) -> None:
        if transfer.cancelled:
            return
        src = self.nodes[transfer.src]
        c, chunk = transfer.content, transfer.chunk
        swarm = src.swarms.get(c)
        if not src.alive or swarm is None:
            self._request_failed(transfer)
            return
        if not swarm.held(chunk):
            if src.origin_pending[c] >> chunk & 1:
                transfer.stage = RELAYING  # sent when the fetch ends (simulations.node.RELAYING)
                self._relays.setdefault(self._chunk_key(transfer.src, c, chunk),
                                        []).append(transfer)
                return
            if not swarm.relaying(chunk) \
                    or swarm.relay_feeder(chunk) == self.nodes[transfer.dst].peer:
                self._request_failed(transfer)
                return
            transfer.cut = True  # a cut-through relay (simulations.node.TAILING)
            self._cut.setdefault(self._chunk_key(transfer.src, c, chunk), []).append(transfer)
        self._send(src.uploads.add(transfer))

    def _request_failed(self, transfer: Transfer) -> None:
        """The sender cannot serve the request (dead, not in the swarm, no chunk)."""
        self._untrack(transfer)
        if not transfer.orphan:
            self.nodes[transfer.dst].counters.failed_requests += 1
            self._deliver(transfer.dst, transfer.content,
                          ChunkFailed(transfer.chunk, self.nodes[transfer.src].peer,
                                      "chunk not held"))

    def _send(self, transfers: list[Transfer]) -> None:
        """Start the flows of peer transfers that just got an upload slot."""
        for transfer in transfers:
            self._start_flow(transfer, self.top.peer_links(transfer.src, transfer.dst))

    def _fetch_origin(self, n: int, c: int, chunk: int) -> None:
        content = self.contents[c]
        o = content.origins[chunk % len(content.origins)]
        key = self._key(n, c, ORIGIN, chunk)
        if key in self._transfers:
            return
        transfer = Transfer(n, c, ORIGIN, chunk, content.chunk_bytes(chunk), origin=o, key=key)
        self._track(transfer)
        node = self.nodes[n]
        node.counters.origin_fetches += 1
        node.origin_pending[c] |= 1 << chunk
        wait = 0.0 if node.download is None else node.download.reserve(transfer.nbytes,
                                                                      self.loop.now)
        self.loop.after(wait + self.origins[o].spec.latency_s, self._origin_request, transfer)

    def _origin_request(self, transfer: Transfer) -> None:
        if transfer.cancelled:
            return
        origin = self.origins[transfer.origin]
        if not origin.up(self.loop.now):
            self._untrack(transfer)
            self._origin_failed(transfer)
            self._deliver(transfer.dst, transfer.content,
                          ChunkFailed(transfer.chunk, None, f"origin {origin.spec.name} down"))
            return
        origin.admit(lambda: self._origin_begin(transfer))

    def _origin_begin(self, transfer: Transfer) -> None:
        if transfer.cancelled:
            self.origins[transfer.origin].release()
            return
        transfer.stage = SENDING
        self._start_flow(transfer, self.top.origin_links(transfer.origin, transfer.dst))

    def _start_flow(self, transfer: Transfer, links: Links) -> None:
        flow = self.flows.start(links, float(transfer.nbytes), self.loop.now, self._flow_done)
        transfer.flow = flow
        if flow >= len(self._by_flow):
            self._by_flow.extend([None] * (flow + 1 - len(self._by_flow)))
        self._by_flow[flow] = transfer

    def _abort(self, transfer: Transfer) -> None:
        """Stop a transfer that has not finished (a node died, a link closed)."""
        transfer.cancelled = True
        sending = transfer.stage == SENDING
        moved = self.flows.cancel(transfer.flow, self.loop.now) if transfer.flow >= 0 else \
            float(transfer.nbytes) if transfer.stage == TAILING else 0.0
        self._untrack(transfer)
        if transfer.src == ORIGIN:
            self.nodes[transfer.dst].counters.wasted_down += moved
            self.origins[transfer.origin].egress_bytes += moved
            self._origin_failed(transfer)
            if sending:
                self.origins[transfer.origin].release()
            return
        if transfer.stage == PACED:
            self._unpace(transfer)
            return
        self._waste(transfer, moved)
        src = self.nodes[transfer.src]
        if src.alive and transfer.stage not in (TRAVELLING, RELAYING, TAILING):
            self._send(src.uploads.finished(transfer) if sending else src.uploads.drop(transfer))

    def _origin_failed(self, transfer: Transfer) -> None:
        """An origin fetch ended without its chunk: so do the relays waiting on it."""
        key = self._chunk_key(transfer.dst, transfer.content, transfer.chunk)
        self.nodes[transfer.dst].origin_pending[transfer.content] &= ~(1 << transfer.chunk)
        for relayed in self._take_relays(self._relays, key):
            if not relayed.cancelled:
                self._untrack(relayed)
                self._relay_failed(relayed)

    def _cancel(self, n: int, c: int, action: Cancel) -> None:
        """As `Link.cancel`: a paced request is dropped and refunded; a sent one (unless
        the cancel is only `if_unsent`) is forgotten and a cancel travels to its sender."""
        key = self._key(n, c, self._index[action.peer], action.chunk)
        transfer = self._transfers.get(key)
        if transfer is None:
            return
        if transfer.stage == PACED:
            self._abort(transfer)  # never sent: its budget comes back
        elif not action.if_unsent:
            del self._transfers[key]
            transfer.orphan = True  # the agent forgets it; the sender still sends
            if self.scenario.agent.cancel_on_wire:
                self.loop.after_lane(self._lane(n, transfer.src), self._cancel_arrived,
                                     transfer)

    def _cancel_arrived(self, transfer: Transfer) -> None:
        """The sender skips a cancelled request unless its piece is going out (p2p.link)."""
        if not transfer.cancelled and transfer.stage != SENDING and transfer.tracked:
            self._abort(transfer)

    def _waste(self, transfer: Transfer, nbytes: float) -> None:
        self.nodes[transfer.dst].counters.wasted_down += nbytes
        self.nodes[transfer.src].counters.wasted_up += nbytes

    def _flow_done(self, flow: int) -> None:
        transfer = self._by_flow[flow]
        assert transfer is not None
        if transfer.cut and not self.nodes[transfer.src].holds(transfer.content, transfer.chunk):
            # The sender's own copy is still coming: the last bytes wait for it.
            self._by_flow[flow] = None
            transfer.flow, transfer.stage = -1, TAILING
            self._send(self.nodes[transfer.src].uploads.finished(transfer))
            return
        self._untrack(transfer)
        self._landed(transfer)

    def _landed(self, transfer: Transfer) -> None:
        """The last byte of `transfer` is in: count it, and hand the chunk over."""
        dst = self.nodes[transfer.dst]
        nbytes, c, chunk = transfer.nbytes, transfer.content, transfer.chunk
        if transfer.src == ORIGIN:
            origin = self.origins[transfer.origin]
            origin.egress_bytes += nbytes
            origin.release()
            dst.counters.down_origin += nbytes
            dst.origin_pending[c] &= ~(1 << chunk)
        else:
            src = self.nodes[transfer.src]
            if transfer.stage not in (RELAYING, TAILING):
                self._send(src.uploads.finished(transfer))
            if transfer.orphan:
                self._waste(transfer, nbytes)
                return
            src.counters.up += nbytes
            if src.rack_index == dst.rack_index:
                dst.counters.down_same_rack += nbytes
            else:
                dst.counters.down_cross_rack += nbytes
        self._arrived(transfer)
        if transfer.src == ORIGIN:
            for relayed in self._take_relays(self._relays, self._chunk_key(transfer.dst, c, chunk)):
                if not relayed.cancelled:
                    self._start_flow(relayed, self.top.peer_links(relayed.src, relayed.dst))

    def _relay_failed(self, transfer: Transfer) -> None:
        if not transfer.orphan:
            self._deliver(transfer.dst, transfer.content,
                          ChunkFailed(transfer.chunk, self.nodes[transfer.src].peer,
                                      "rejected: the origin fetch it relayed failed"))

    def _arrived(self, transfer: Transfer) -> None:
        """The chunk of `transfer` is in, whole and verified, at its receiver."""
        dst = self.nodes[transfer.dst]
        c, chunk = transfer.content, transfer.chunk
        source = None if transfer.src == ORIGIN else self.nodes[transfer.src].peer
        self.last_progress = self.loop.now
        swarm = dst.swarms[c]
        new = not swarm.held(chunk)
        if not new and source is not None:  # the agent throws it away and counts it wasted
            self._waste(transfer, transfer.nbytes)
        self._deliver(transfer.dst, c, ChunkArrived(chunk, source, True))
        if new and swarm.held(chunk):
            self._held[c][chunk * len(self.nodes) + transfer.dst] = 1
            for relayed in self._take_relays(self._cut, self._chunk_key(transfer.dst, c, chunk)):
                if relayed.stage == TAILING and not relayed.cancelled:
                    self._untrack(relayed)
                    self._landed(relayed)
        if new and c in dst.hot_left and self._hot_mask[c] >> chunk & 1:
            dst.hot_left[c] -= 1
            if dst.hot_left[c] == 0:
                self._content_ready(dst, c)

    # ---- readiness ------------------------------------------------------------------

    def _finish(self, node: SimNode, c: int) -> None:
        """The swarm ignores every event from now on."""
        node.finished.add(c)
        held, nodes = self._held[c], len(self.nodes)
        held[node.index::nodes] = b"\x01" * self.contents[c].chunks

    def _completed(self, node: SimNode, c: int) -> None:
        self._finish(node, c)
        if c not in node.hot_left:
            self._content_ready(node, c)
        node.unfinished -= 1  # (its core brought the next announce forward)
        if node.unfinished == 0:
            node.complete_s = self.loop.now
            self.unfinished -= 1
            self._maybe_done()

    def _maybe_done(self) -> None:
        if self.unfinished == 0 and self._cpu_jobs == 0:
            self.loop.stop("complete")

    def _content_ready(self, node: SimNode, c: int) -> None:
        """The node holds what it needs of content `c`: ready for it once its CPU work (if
        the scenario gives any) is done."""
        work = self.contents[c].cpu(self.strategy.name)
        if work <= 0:
            self._ready(node)
            return
        key = -1 if self.scenario.cpu.shared else node.index
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = CpuPool(self.scenario.cpu.cores)
        pool.add(self.loop.now, (node.index, c), work)
        self._cpu_jobs += 1
        self._arm_pool(key, pool)

    def _arm_pool(self, key: int, pool: CpuPool) -> None:
        end = pool.next_end()
        if end is not None:
            self.loop.at(end, self._cpu_tick, (key, pool.generation))

    def _cpu_tick(self, arg: tuple[int, int]) -> None:
        key, generation = arg
        pool = self._pools[key]
        if generation != pool.generation:
            return  # a job came or went since: a later tick is armed
        self.last_progress = self.loop.now  # CPU work is progress too (the stall watch)
        for n, _ in pool.finish(self.loop.now):
            self._cpu_jobs -= 1
            if self.nodes[n].alive:
                self._ready(self.nodes[n])
        self._arm_pool(key, pool)
        self._maybe_done()

    def _ready(self, node: SimNode) -> None:
        node.ready_left -= 1
        if node.ready_left == 0:
            node.ready_s = self.loop.now
            self.ready += 1
            self.egress_curve.append((self.ready, sum(o.egress_bytes for o in self.origins)))
