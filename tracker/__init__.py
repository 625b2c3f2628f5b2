"""tracker: the control plane, which knows who holds what.

Owns the no-I/O core - the registry of swarm members (`registry`) and the
peer handout policies (`handout`), which the simulator drives unchanged - the
no-I/O request memories (`limits`: replay cache, rate limits), and the aiohttp
service around them (`app` views, `guard` authentication and connection
bounds, `store` write-once documents, `names` the name rules, `config`, `cli`). It may import the
shared types of `p2p` (`p2p.content`, `p2p.auth`, `p2p.cli`); `p2p` never
imports it (agents reach it through `p2p.tracker_client`, over HTTP).
"""
