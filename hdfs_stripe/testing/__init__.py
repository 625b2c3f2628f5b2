"""Tooling for tests and benchmarks: Hadoop's mini cluster (a real NameNode and DataNodes).
Product code never imports this room.
"""
