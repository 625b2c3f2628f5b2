"""The README's walkthrough and launch, run as written against real processes.

The fenced blocks under "One machine, by hand" and "A launch in ten lines" are
taken from README.md as it is committed and run as one shell script, as a reader
pastes them one after the other. Two things change, and only those: the ports
become free ones and the directory a temporary one (the same text a reader would
type, with other numbers), and each server started in the background is waited
for until it prints its "listening" line, which a reader does by eye (its
output goes to a log unless the line sends it somewhere itself). Everything
else, every flag and every command, runs unchanged: a real tracker, origin,
agents, registry, HDFS mini cluster, FUSE mounts and runc.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
WALK_DIR = "/tmp/bootseer-walk"
WALK_PORTS = ("7070", "8080", "7080", "7081", "5000")
BACKGROUND = re.compile(r"^(?P<cmd>.*?)\s&\s*(?:#.*)?$")
REDIRECTED = re.compile(r"\s>\s*(?P<file>\S+)\s*$")

# Waits for a log to show the listening line; fails at once if its process died.
PREAMBLE = """
wait_listening() {
  for _ in $(seq 1200); do
    grep -q '"event": "listening"' "$1" && return 0
    kill -0 "$2" 2>/dev/null || { echo "$1: the process exited:"; cat "$1"; return 1; }
    sleep 0.1
  done
  echo "$1: no listening line within 120 s"; cat "$1"; return 1
}
"""


def block(heading: str) -> str:
    """The first shell block under `heading` in README.md."""
    section = README.read_text().split(f"## {heading}\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def walkthrough() -> str:
    return block("One machine, by hand") + block("A launch in ten lines")


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def as_script(block: str, workdir: Path, ports: list[int]) -> str:
    for old, new in zip(WALK_PORTS, ports, strict=True):
        block = block.replace(old, str(new))
    block = block.replace(WALK_DIR, str(workdir))
    lines = []
    for n, line in enumerate(block.replace("\\\n", " ").splitlines()):
        match = BACKGROUND.match(line)
        if match is None:
            lines.append(line)
            continue
        log = shlex.quote(str(workdir.parent / f"server-{n}.log"))
        if (redirected := REDIRECTED.search(match["cmd"])) is None:
            lines.append(f"{match['cmd']} > {log} 2>&1 &")
        else:  # the reader's own file is where the listening line goes
            lines.append(f"{match['cmd']} 2> {log} &")
            log = redirected["file"]
        lines.append(f"echo $! >> {shlex.quote(str(workdir.parent / 'pids'))}")
        lines.append(f"wait_listening {log} $!")
    return PREAMBLE + "\n".join(lines) + "\n"


def test_readme_walkthrough_and_launch_run_as_written(fuse_ready: None, tmp_path: Path) -> None:
    text = walkthrough()
    for needle in (WALK_DIR, *WALK_PORTS, "bootseer origin", "bootseer publish",
                   "bootseer get", "bootseer launch"):
        assert needle in text, f"the walkthrough no longer has {needle!r}"
    workdir = tmp_path / "walk"
    script = as_script(text, workdir, free_ports(len(WALK_PORTS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    try:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    finally:
        _stop_servers(tmp_path / "pids")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    gets = [json.loads(line) for line in done.stdout.splitlines()
            if line.startswith('{"content"')]
    assert len(gets) == 2, done.stdout
    first, second = gets
    size = (workdir / "files" / "model.bin").stat().st_size
    assert first["complete"] and first["origin_bytes"] == size
    assert second["complete"] and second["peer_bytes"] == size
    assert second["origin_bytes"] == 0
    assert "same bytes" in done.stdout
    assert done.stdout.splitlines()[-1] == "['model.bin']", done.stdout[-2000:]


def _stop_servers(pids: Path) -> None:
    """SIGTERM, as the walkthrough's `kill` does, then time for each server to stop what it
    started (`dev registry` its docker-registry, `dev hdfs` its JVM); SIGKILL if it must."""
    if not pids.exists():
        return
    left = [int(pid) for pid in pids.read_text().split()]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for _ in range(600):  # bounded: 60 s
        left = [pid for pid in left if Path(f"/proc/{pid}").exists()]
        if not left:
            return
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 200
