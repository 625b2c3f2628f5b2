"""The native parts: p2p/_bytepath.c (the agent's receive, hash and write loop) and
simulations/_hugearena.c (pymalloc's arenas on huge pages, for the simulator).

Everything else is declared in pyproject.toml. Both extensions are optional: without
xxhash.h (Debian's libxxhash-dev, which `make setup` installs) the build skips the
byte path and p2p.bytepath uses its pure-Python twin; without a C compiler it skips
both, and the simulator runs on glibc's malloc with huge pages instead
(simulations.hugearena).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("p2p._bytepath", ["p2p/_bytepath.c"], libraries=["xxhash"],
              extra_compile_args=["-O2"], optional=True),
    Extension("simulations._hugearena", ["simulations/_hugearena.c"],
              extra_compile_args=["-O2"], optional=True),
])
