"""The README's walkthrough, run as written against real processes on 127.0.0.1.

The fenced block under "One machine, by hand" is taken from README.md as it is
committed. Two things change, and only those: its ports become free ones and its
directory a temporary one (the same text a reader would type, with other
numbers), and each server started in the background gets its output sent to a
log and is waited for until it prints its "listening" line, which a reader does
by eye. Everything else, every flag and every command, runs unchanged.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
WALK_DIR = "/tmp/bootseer-walk"
WALK_PORTS = ("7070", "8080", "7080", "7081")
BACKGROUND = re.compile(r"^(?P<cmd>.*?)\s&\s*(?:#.*)?$")

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


def walkthrough() -> str:
    text = README.read_text()
    section = text.split("## One machine, by hand", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


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
        lines.append(f"{match['cmd']} > {log} 2>&1 &")
        lines.append(f"echo $! >> {shlex.quote(str(workdir.parent / 'pids'))}")
        lines.append(f"wait_listening {log} $!")
    return PREAMBLE + "\n".join(lines) + "\n"


def test_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    block = walkthrough()
    for needle in (WALK_DIR, *WALK_PORTS, "bootseer origin", "bootseer publish",
                   "bootseer get"):
        assert needle in block, f"the walkthrough no longer has {needle!r}"
    workdir = tmp_path / "walk"
    script = as_script(block, workdir, free_ports(len(WALK_PORTS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    try:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
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


def _stop_servers(pids: Path) -> None:
    if not pids.exists():
        return
    for pid in pids.read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 200
