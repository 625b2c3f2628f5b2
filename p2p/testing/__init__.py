"""Tooling for tests, the demo and benchmarks: local clusters of real agents and an
emulated network. Product code never imports this room.
"""
