"""The generated docs match the code, the samples load, and the docs' links lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from p2p.config import AgentConfig, load_agent_config
from p2p.configdoc import field_docs
from p2p.swarm import SwarmConfig
from tracker.config import TrackerConfig, load_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
# Written by the helpers of the trust issues on their own branches; linked from here.
ELSEWHERE = {"docs/trust.md", "docs/trust-content.md"}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_committed_reference_matches_the_config_classes() -> None:
    done = subprocess.run([sys.executable, str(REPO / "docs" / "generate.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, f"run python docs/generate.py:\n{done.stderr}"


@pytest.mark.parametrize("cls", [AgentConfig, SwarmConfig, TrackerConfig],
                         ids=lambda c: c.__name__)
def test_every_config_key_is_documented(cls: type) -> None:
    undocumented = [doc.name for doc in field_docs(cls) if not doc.doc]
    assert undocumented == [], f"{cls.__name__}: add a comment to {undocumented}"


def test_field_docs_read_trailing_continued_and_block_comments() -> None:
    docs = {doc.name: doc.doc for doc in field_docs(AgentConfig)}
    assert docs["upload_order"].startswith("which waiting piece gets a free slot")
    assert docs["upload_order"].endswith("(p2p.swarm.uploads)")  # the continuation line
    swarm = {doc.name: doc.doc for doc in field_docs(SwarmConfig)}
    assert swarm["cross_rack_share"].startswith("Of those, at least this share")  # above
    assert swarm["max_inflight"] == "requests to peers, all together"


def test_sample_configs_load_and_hold_the_defaults() -> None:
    agent = load_agent_config(str(EXAMPLES / "agent.toml"), env={})
    assert agent == AgentConfig()
    tracker = load_config(str(EXAMPLES / "tracker.toml"), {})
    assert tracker == TrackerConfig()


def test_links_in_the_docs_lead_to_files() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if path.relative_to(REPO).as_posix() not in ELSEWHERE and not path.exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []
