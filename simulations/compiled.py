"""The simulator on compiled cores: the same source, built with mypyc, about twice as fast.

`bootseer sim --engine compiled` (the default) runs the simulation in a child
process whose import path starts with a build of this installation's `p2p`,
`tracker` and `simulations` packages in which the modules a run spends its time
in (`HOT`: the swarm and node cores, the tracker's registry and handouts, the
simulator's loop, network and nodes) are C extensions compiled by mypyc from
their own source. Compiling changes the time a run takes, not what it computes:
`tests/simulations/test_sim_compiled.py` runs both engines on the same scenario and
requires the same per-node results.

A build is keyed by a digest of every file it copies, the Python version and
mypyc's, and kept under the cache directory (`BOOTSEER_CACHE`, else
`$XDG_CACHE_HOME/bootseer`, else `~/.cache/bootseer`). It is made once per
source version, in about a minute on two cores, and reused; an edited file
gives a new key, never a stale module.
When it cannot be made (no C compiler, no Python headers) the run says why and
goes on in plain Python. The child's small objects live on transparent huge pages
(simulations.hugearena says why and how); that too changes the time, not the results.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from simulations import hugearena

PACKAGES = ("p2p", "tracker", "simulations")
HOT = ("p2p/swarm/*.py", "p2p/ratelimit.py", "p2p/content.py", "p2p/draws.py",
       "tracker/registry.py", "tracker/handout.py", "tracker/machine.py", "tracker/index.py",
       "simulations/engine.py", "simulations/network.py", "simulations/node.py",
       "simulations/simulation.py", "simulations/tracker.py", "simulations/workload.py",
       "simulations/strategy.py", "simulations/floor.py", "simulations/cpu.py")
SUFFIXES = (".py", ".toml")


class BuildError(Exception):
    """The compiled build could not be made; the message says what was missing."""


def active() -> bool:
    """Whether this process runs the compiled build (its simulator is an extension)."""
    from simulations import simulation

    return not simulation.__file__.endswith(".py")


def source_root() -> Path:
    """The directory holding this installation's packages (the repository, or site-packages)."""
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """`BOOTSEER_CACHE`, else the user's cache directory as the sample images use it
    (`fusefs.testing.debian`: `XDG_CACHE_HOME`, else ~/.cache), then bootseer/."""
    base = os.environ.get("BOOTSEER_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bootseer"
    return Path(base) / "sim-compiled"


def _sources(root: Path) -> list[Path]:
    found = [p.relative_to(root) for pkg in PACKAGES for p in (root / pkg).rglob("*")
             if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    # The arena allocator's binary too, copied as it is (simulations.hugearena).
    return sorted(found + [Path(n) for n in hugearena.NATIVE if (root / n).is_file()])


def digest(root: Path) -> str:
    """A key for the build: every copied file (the arena module's binary too), the Python
    and mypyc versions, `HOT`."""
    import mypy.version

    h = hashlib.sha256(f"{sys.version}\0{mypy.version.__version__}\0{HOT}".encode())
    for rel in _sources(root):
        h.update(f"\0{rel}\0".encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:20]


def build(root: Path | None = None, cache: Path | None = None) -> Path:
    """The build for this source, made if it is not in the cache yet. Raises BuildError."""
    root = root or source_root()
    cache = cache or cache_dir()
    try:
        key = digest(root)
    except ImportError:
        raise BuildError("mypy is not installed (pip install 'bootseer[sim]')") from None
    done = cache / key
    if (done / ".complete").exists():
        return done
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with _building(cache / f".{key}.lock"):
            if (done / ".complete").exists():  # made while this run waited for the lock
                return done
            print(f"bootseer sim: compiling the simulator's cores with mypyc into {done} "
                  "(once per source version, about a minute)", file=sys.stderr, flush=True)
            work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache))
            try:
                _compile(root, work)
                try:
                    work.rename(done)
                except OSError:
                    if not (done / ".complete").exists():  # not a build made beside it
                        raise
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as exc:
        raise BuildError(f"cannot write the build in {cache}: {exc.strerror or exc}") from None
    _prune(cache, keep=done)
    return done


@contextlib.contextmanager
def _building(lock: Path) -> Iterator[None]:
    """One build of a key at a time on this machine: runs started together (a sweep's
    workers, a test session beside a study) wait for the first one's build, not make
    their own on the same cores."""
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # Gone once its build is made or has failed: nothing is left beside the builds.
            # A run still waiting on it wakes to a made build, or builds (a rare second
            # build of one key is then renamed over, see `build`).
            lock.unlink(missing_ok=True)


def _compile(root: Path, work: Path) -> None:
    """Copy the packages into `work` and compile `HOT` there, in place."""
    for rel in _sources(root):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, work / rel)
    hot = sorted({str(p.relative_to(work)) for pattern in HOT for p in work.glob(pattern)})
    made = subprocess.run([sys.executable, "-m", "mypyc", "--ignore-missing-imports", *hot],
                          cwd=work, capture_output=True, text=True)
    if made.returncode != 0:
        tail = (made.stderr or made.stdout).strip().splitlines()[-3:]
        raise BuildError("mypyc failed: " + " / ".join(tail))
    for scratch in ("build", ".mypy_cache"):  # the C sources and mypy's cache: 15 MB
        shutil.rmtree(work / scratch, ignore_errors=True)
    (work / ".complete").touch()


def _prune(cache: Path, keep: Path, builds: int = 3) -> None:
    """Keep the newest few builds (a few MB each): older sources are rarely run again."""
    made = sorted((p for p in cache.iterdir() if (p / ".complete").exists() and p != keep),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in made[builds - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def run_child(build_dir: Path, argv: list[str]) -> int:
    """`bootseer ARGV` with the compiled build first on the import path, on the
    allocator of `child_env`; its exit status."""
    # -P: the working directory (a checkout, perhaps) must not come before the build.
    # simulations.hugearena's entry installs the huge-page arenas, then runs `bootseer`.
    return subprocess.run([sys.executable, "-P", "-m", "simulations.hugearena", *argv],
                          env=child_env(build_dir)).returncode


def child_env(build_dir: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run's process: the build first on its path, and an allocator
    on transparent huge pages (simulations.hugearena): CPython's own with the arena
    module where the build holds it, else glibc's. Settings the caller made stay."""
    environ = dict(os.environ if environ is None else environ)
    env = dict(environ, PYTHONPATH=os.pathsep.join(
        [str(build_dir), *filter(None, [environ.get("PYTHONPATH")])]))
    return hugearena.environ(env, arenas=hugearena.built_in(build_dir))
