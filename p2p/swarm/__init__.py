"""The no-I/O swarm core: events in, actions out, `now` and a seeded rng passed in.

`Swarm` decides for one content; `Node` for what spans a node's contents, and
it drives its swarms (their events and one timer for them all). `Node` owns
`Links`, the join table: which peers are joined for each content, on which
link.

May import only the standard library and `p2p.content`. The agent (asyncio)
and the simulator (virtual time) both drive these objects unchanged.
"""

from p2p.swarm.config import SwarmConfig
from p2p.swarm.node import Node
from p2p.swarm.swarm import Swarm

__all__ = ["Node", "Swarm", "SwarmConfig"]
