"""`bootseer bench`: the swarm benchmark, and the parser that gathers every package's
benchmarks. Product code never imports this room.
"""
