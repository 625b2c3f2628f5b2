"""simulations: a discrete-event simulator that drives the real swarm policies.

Owns the event loop on virtual time (`engine`), the network model (`network`),
simulated nodes and tracker (`node`, `tracker`), workloads, named strategies,
scenario files and reports, and the `bootseer sim` command. It imports the
no-I/O cores `p2p.swarm`, `tracker.registry` and `tracker.handout` and runs
them unchanged; it never imports their I/O shells (agent, store, wire,
tracker app) or asyncio and sockets. tests/simulations/test_sim_imports.py holds it to that.
"""
