"""`bootseer dev hdfs`: Hadoop's mini cluster for a person (see p2p.testing.dev)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from p2p.errors import UserError

DEV_DIR = Path("/tmp/bootseer-dev/hdfs")


def add_commands(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = kinds.add_parser("hdfs", help="run an HDFS mini cluster (a real NameNode and "
                                      "DataNodes, with WebHDFS) on 127.0.0.1 until stopped")
    p.add_argument("--datanodes", type=int, default=3, help="DataNodes to start")
    p.add_argument("--dir", type=Path, default=DEV_DIR, help="where its data and log are kept")
    p.add_argument("--put", action="append", default=[], metavar="FILE=/HDFS/PATH",
                   help="copy a local file into the cluster once it runs (repeatable)")
    p.set_defaults(run=_run_hdfs)


def _run_hdfs(args: argparse.Namespace) -> int:
    puts = [_put(text) for text in args.put]
    if args.datanodes < 1:
        raise UserError("--datanodes must be at least 1")
    return asyncio.run(_serve(args.dir.absolute(), args.datanodes, puts))


def _put(text: str) -> tuple[Path, str]:
    local, sep, remote = text.partition("=")
    if not sep or not remote.startswith("/"):
        raise UserError(f"--put {text}: give FILE=/HDFS/PATH")
    if not Path(local).is_file():
        raise UserError(f"--put {text}: {local} is not a file")
    return Path(local), remote


async def _serve(workdir: Path, datanodes: int, puts: list[tuple[Path, str]]) -> int:
    from hdfs_stripe.testing.minicluster import MiniClusterError, MiniHdfs
    from hdfs_stripe.webhdfs import WebHdfs
    from p2p.testing.dev import until_stopped

    try:
        cluster = await MiniHdfs.start(workdir, datanodes=datanodes)
    except MiniClusterError as exc:
        raise UserError(str(exc)) from None
    try:
        async with WebHdfs(cluster.http_url) as client:
            for local, remote in puts:
                data = await asyncio.to_thread(local.read_bytes)
                await client.create(remote, data, replication=min(2, datanodes))
        print(json.dumps({"event": "listening", "webhdfs": cluster.http_url,
                          "uri": cluster.uri("/"), "files": [cluster.uri(r) for _, r in puts],
                          "log": str(cluster.log_path)}), flush=True)
        await until_stopped()
    finally:
        await cluster.stop()
    return 0
