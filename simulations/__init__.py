"""simulations: discrete-event simulator that drives the real swarm policies."""
