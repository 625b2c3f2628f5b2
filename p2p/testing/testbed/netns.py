"""Building and removing a testbed (see `p2p.testing.testbed.plan`) with `ip` and `tc`.

`up` adds the namespaces, runs the plan's batches and records the spec in a
state file (`/run/bootseer/testbed-<name>.json`); if any step fails, what was
made is removed again before the error is raised. `down` removes every
namespace and link of the testbed's shape, and the state file. The shapes
are the testbed's own (`<name>-n<i>`, `<name>-origin`, `<name>-core`,
`<name>-r<r>`, `<name>-u<r>[c]`): a namespace or link of another shape is
never touched, and one of ours that exists already makes `up` refuse rather
than adopt it. Every command runs under a
time-out, so neither call can hang.

Needs root (CAP_NET_ADMIN) and iproute2 (`ip`, `tc`; the `sch_tbf` qdisc).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from p2p.testing.testbed.plan import Batch, Host, Plan, Spec, commands, in_namespace, plan

STATE_DIR = Path("/run/bootseer")
COMMAND_TIMEOUT_S = 60.0


class TestbedError(RuntimeError):
    """The testbed cannot be built, found or removed; the message says why and what to do."""

    __test__ = False  # not a pytest class, despite its name


class Testbed:
    """A testbed that is up: its plan, and how to run a command in one of its hosts."""

    __test__ = False

    def __init__(self, p: Plan) -> None:
        self.plan = p
        self.nodes: Sequence[Host] = p.nodes
        self.origin = p.origin

    @property
    def name(self) -> str:
        return self.plan.spec.name

    @staticmethod
    def command(host: Host, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `host`'s network namespace."""
        return in_namespace(host.netns, argv)

    def host(self, name: str) -> Host:
        """A host by namespace name, `origin`, or node index (`n3` or `3`)."""
        for h in (self.origin, *self.nodes):
            if name in (h.netns, h.netns.removeprefix(self.name + "-")):
                return h
        if name.isdigit() and int(name) < len(self.nodes):
            return self.nodes[int(name)]
        raise TestbedError(f"testbed {self.name} has no host {name!r} (nodes n0..n"
                           f"{len(self.nodes) - 1}, and origin)")


def up(spec: Spec) -> Testbed:
    """Build `spec`; TestbedError (nothing left behind) if it cannot."""
    p = plan(spec)
    _check_tools()
    state = _state_path(spec.name)
    if state.exists():
        raise TestbedError(f"a testbed named {spec.name} is up already ({state}); run "
                           f"`bootseer testbed down --name {spec.name}` first")
    taken = sorted(set(_our_namespaces(spec.name)) | set(_our_links(spec.name)))
    if taken:
        raise TestbedError(f"{', '.join(taken[:5])} exist(s) already, left by an earlier run; "
                           f"run `bootseer testbed down --name {spec.name}` first")
    try:
        _run(Batch("ip", None, tuple(f"netns add {ns}" for ns in p.namespaces)))
        for batch in commands(p):
            _run(batch)
    except TestbedError:
        _remove(spec.name)
        raise
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"spec": _spec_dict(spec)}))
    return Testbed(p)


def find(name: str = "bs") -> Testbed:
    """The testbed `name` that is up; TestbedError if there is none."""
    try:
        raw = json.loads(_state_path(name).read_text())
        spec = Spec(**raw["spec"])
    except FileNotFoundError:
        raise TestbedError(f"no testbed named {name} is up (no {_state_path(name)})") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise TestbedError(f"{_state_path(name)} is damaged ({exc}); run `bootseer testbed "
                           f"down --name {name}`") from None
    return Testbed(plan(spec))


def down(name: str = "bs") -> list[str]:
    """Remove testbed `name` (also the remains of a failed `up`); what was removed."""
    if not re.fullmatch(r"[a-z][a-z0-9]{0,3}", name):
        raise TestbedError(f"testbed name {name!r}: 1-4 lower-case letters and digits")
    _check_tools()
    removed = _remove(name)
    _state_path(name).unlink(missing_ok=True)
    return removed


@contextmanager
def testbed(spec: Spec) -> Iterator[Testbed]:
    """`up`, then `down` however the block ends."""
    bed = up(spec)
    try:
        yield bed
    finally:
        down(spec.name)


def _remove(name: str) -> list[str]:
    """Delete every namespace and host link of testbed `name`'s shape; what was deleted."""
    namespaces, links = _our_namespaces(name), _our_links(name)
    lines = [f"netns del {ns}" for ns in namespaces] + [f"link del {ln}" for ln in links]
    if lines:  # -force: go on past a veth end already gone with its peer
        _run(Batch("ip", None, tuple(lines)), force=True)
    left = _our_namespaces(name) + _our_links(name)
    if left:
        raise TestbedError(f"could not remove {', '.join(left)}; remove them with "
                           "`ip netns del` / `ip link del`")
    return namespaces + links


def _our_namespaces(name: str) -> list[str]:
    out = _output(["ip", "netns", "list"])
    shape = re.compile(rf"{re.escape(name)}-(n\d+|origin)")
    return [line.split()[0] for line in out.splitlines()
            if line.split() and shape.fullmatch(line.split()[0])]


def _our_links(name: str) -> list[str]:
    out = _output(["ip", "-o", "link", "show"])
    shape = re.compile(rf"{re.escape(name)}-(core|r\d+|u\d+c?|n\d+|origin)")
    links = []
    for line in out.splitlines():
        fields = line.split(":", 2)
        if len(fields) > 1:
            link = fields[1].strip().split("@")[0]
            if shape.fullmatch(link):
                links.append(link)
    return links


def _run(batch: Batch, force: bool = False) -> None:
    argv = batch.argv()
    if force:
        argv.insert(1, "-force")
    try:
        done = subprocess.run(argv, input="\n".join(batch.lines) + "\n", text=True,
                              capture_output=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(batch.argv())}` did not finish within "
                           f"{COMMAND_TIMEOUT_S:g} s") from None
    if not force and done.returncode != 0:
        raise TestbedError(f"`{' '.join(batch.argv())}` failed: "
                           f"{done.stderr.strip()[-800:] or done.returncode}")


def _output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True,
                              timeout=COMMAND_TIMEOUT_S).stdout
    except subprocess.CalledProcessError as exc:
        raise TestbedError(f"`{' '.join(argv)}` failed: {exc.stderr.strip()}") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within "
                           f"{COMMAND_TIMEOUT_S:g} s") from None


def _check_tools() -> None:
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise TestbedError(f"{' and '.join(missing)} not found: install the Debian package "
                           "iproute2 (`make setup` does)")
    if os.geteuid() != 0:
        raise TestbedError("building network namespaces needs root (CAP_NET_ADMIN); run "
                           "this as root")


def _state_path(name: str) -> Path:
    return STATE_DIR / f"testbed-{name}.json"


def _spec_dict(spec: Spec) -> dict[str, object]:
    return {f: getattr(spec, f) for f in Spec.__dataclass_fields__}
