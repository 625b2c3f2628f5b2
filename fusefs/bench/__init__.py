"""Benchmarks of image mounts and launches, and the baselines they are measured against.
Product code never imports this room.
"""
