"""p2p: the swarm that moves immutable contents between nodes.

Owns the content model (`content`), the no-I/O policy core (`swarm`), the
chunk store, the wire protocol, origin adapters and the per-node agent.
It knows nothing of images, dependency snapshots, HDFS or the tracker's
internals; those packages build on it.
"""
