"""Tooling for tests and benchmarks: a real OCI registry on loopback, sample images and
their Debian files. Product code never imports this room.
"""
