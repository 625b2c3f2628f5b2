"""Sweeps: many runs of one scenario, varied by key and seed, on a Dask cluster.

`plan` reads a sweep file and names its runs (no I/O, mypy-strict); `run` runs
them as Dask tasks; `data` writes their results as a Parquet dataset and draws
the plots; `cli` is `bootseer sim sweep` and `bootseer sim report`.
"""
