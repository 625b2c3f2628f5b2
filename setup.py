"""The one native part: p2p/_bytepath.c (the agent's receive, hash and write loop).

Everything else is declared in pyproject.toml. The extension is optional: without
xxhash.h (Debian's libxxhash-dev, which `make setup` installs) the build skips it and
p2p.bytepath uses its pure-Python twin.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("p2p._bytepath", ["p2p/_bytepath.c"], libraries=["xxhash"],
                             extra_compile_args=["-O2"], optional=True)])
