"""Tooling for tests and benchmarks: a wheelhouse of real wheels. Product code never
imports this room.
"""
