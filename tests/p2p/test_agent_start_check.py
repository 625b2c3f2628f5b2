"""An agent says at start whether its tracker answers it: a wrong cluster secret or a
tracker that is down is one clear line in its log (and a 0 in bootseer_tracker_reachable)
at once, not silence until it has a content to announce (issue 36, item 8)."""

from __future__ import annotations

import secrets
from pathlib import Path

from helpers.promtext import metric
from helpers.waiting import until

from p2p.process import free_port
from p2p.testing.localcluster import AgentHandle, LocalCluster, to_toml


async def start_agent(cluster: LocalCluster, name: str, tracker: str,
                      secret: str | None = None) -> AgentHandle:
    workdir = cluster.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    sock, cfg = str(workdir / "api.sock"), workdir / "agent.toml"
    cfg.write_text(to_toml({"tracker": tracker, "host": "127.0.0.1", "port": 0,
                            "rack": "rack0", "peer_id": name, "store_dir": str(workdir / "s"),
                            "api_socket": sock}))
    env = cluster.env if secret is None else {**cluster.env, "BOOTSEER_SECRET": secret}
    child = await cluster.spawn(name, ["agent", "--config", str(cfg)], env=env)
    return AgentHandle(0, child, sock, workdir / "s", cfg)


async def says(agent: AgentHandle, text: str, reachable: int) -> None:
    async def logged() -> bool:
        async with agent.client(10.0) as client:
            up = metric(await client.metrics(), "bootseer_tracker_reachable")
        return text in agent.child.stderr_path.read_text(errors="replace") and up == reachable

    await until(logged, f"the agent's log says {text!r}")


async def test_the_agent_says_at_start_whether_its_tracker_answers(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    try:
        await cluster.start_tracker()
        good = await start_agent(cluster, "good", cluster.tracker_url)
        await says(good, "", 1)  # nothing to say at the default log level: all is well
        wrong = await start_agent(cluster, "wrong", cluster.tracker_url,
                                  secrets.token_urlsafe(32))
        await says(wrong, "cluster secret is not the tracker's", 0)
        nowhere = await start_agent(cluster, "nowhere", f"http://127.0.0.1:{free_port()}")
        await says(nowhere, "unreachable", 0)
    finally:
        await cluster.stop()
