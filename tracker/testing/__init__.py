"""Tooling for tests and benchmarks: a real redis-server for tracker replicas. Product code
never imports this room.
"""
