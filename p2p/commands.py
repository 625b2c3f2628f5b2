"""Subcommands owned by p2p: agent, origin, publish, get, status (`demo` and `bench` are
tooling with entry points of their own, in p2p.testing and p2p.bench)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import uvloop

from p2p import discovery
from p2p.auth import load_secret
from p2p.content import CHUNK_SIZE, DEFAULT_DIGEST, DIGESTS, Manifest
from p2p.discovery import find_api_socket
from p2p.errors import UserError
from p2p.units import MiB

SUPPRESS = argparse.SUPPRESS
SWITCH_INTERVAL_S = 0.0005  # the agent's GIL switch interval: see _serve_agent


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _agent_parser(sub)
    p = sub.add_parser("origin", help="serve a directory as an HTTP origin (Range, rate cap)")
    p.add_argument("root", type=Path, help="the directory whose files are served")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080, help="TCP port; 0 picks a free one")
    p.add_argument("--rate-mbps", type=float, default=None,
                   help="cap on total egress in MB/s (10^6 bytes a second); default: no cap")
    p.set_defaults(run=_run_origin)

    p = sub.add_parser("publish", help="register a file's manifest with the tracker")
    p.add_argument("path", type=Path)
    p.add_argument("--origin", required=True, help="URL of the origin copy (http://, file://)")
    p.add_argument("--tracker", default=os.environ.get("BOOTSEER_TRACKER",
                                                       "http://127.0.0.1:7070"))
    p.add_argument("--chunk-size-mb", type=int, default=CHUNK_SIZE // MiB,
                   help="chunk size in MiB (2^20 bytes)")
    p.add_argument("--digest", choices=sorted(DIGESTS), default=DEFAULT_DIGEST,
                   help="chunk digest: xxh3-128 (fast) or blake3 (cryptographic, for "
                        "clusters that do not trust every node)")
    p.add_argument("--name", help="also bind this name to the content (names never change)")
    p.add_argument("--no-origin-check", dest="origin_check", action="store_false",
                   help="publish without first reading the file's last chunk from --origin "
                        "(for an origin that only the nodes can reach)")
    p.set_defaults(run=_run_publish)

    p = sub.add_parser("get", help="have the local agent fetch a content (and copy it out)")
    p.add_argument("content", metavar="ID|NAME",
                   help="a content id (c1-...) or a name given with `publish --name`")
    p.add_argument("--out", type=Path, help="write the verified bytes to this file")
    p.add_argument("--tracker", default=os.environ.get("BOOTSEER_TRACKER",
                                                       "http://127.0.0.1:7070"),
                   help="where a name is looked up (env BOOTSEER_TRACKER)")
    _api_socket_flag(p)
    p.set_defaults(run=_run_get)

    p = sub.add_parser("status", help="what the local agent holds and fetches")
    p.add_argument("content", nargs="?", metavar="CONTENT",
                   help="only this content: its id, or a name the tracker holds for it")
    p.add_argument("--tracker", default=os.environ.get("BOOTSEER_TRACKER",
                                                       "http://127.0.0.1:7070"),
                   help="where a name is looked up (env BOOTSEER_TRACKER)")
    _api_socket_flag(p)
    p.set_defaults(run=_run_status)


def _api_socket_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-socket", help="the local agent's API socket; default: "
                   "BOOTSEER_API_SOCKET, else the one agent running on this node "
                   "(p2p.discovery), else /run/bootseer/agent.sock")


def _agent_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="run the peer agent of this node",
                       argument_default=SUPPRESS)
    p.add_argument("--config", dest="config_file",
                   help="TOML file of the keys below and more (docs/configuration.md)")
    p.add_argument("--tracker", help="tracker URL")
    p.add_argument("--host", help="address peers connect to")
    p.add_argument("--port", type=int, help="peer port (0 = any free port)")
    p.add_argument("--rack")
    p.add_argument("--peer-id", dest="peer_id")
    p.add_argument("--store-dir", dest="store_dir")
    p.add_argument("--store-budget-gb", dest="store_budget_gb", type=float)
    p.add_argument("--api-socket", dest="api_socket")
    p.add_argument("--api-group", dest="api_group", help="group that may use the API socket")
    p.add_argument("--metrics-port", dest="metrics_port", type=int,
                   help="serve Prometheus /metrics on this TCP port too")
    p.add_argument("--secret-file", dest="secret_file")
    p.add_argument("--upload-mbps", dest="upload_mbps", type=float)
    p.add_argument("--download-mbps", dest="download_mbps", type=float)
    p.add_argument("--origin-concurrency", dest="origin_concurrency", type=int)
    p.add_argument("--mirror", metavar="HOST:PORT",
                   help="also serve a pull-through registry mirror here (containerd, docker)")
    p.add_argument("--mirror-upstream", dest="mirror_upstream", metavar="URL",
                   help="the registry for mirror clients that name none (e.g. https://host)")
    p.add_argument("--log-level", dest="log_level",
                   default=os.environ.get("BOOTSEER_LOG_LEVEL", "WARNING"),
                   help="DEBUG, INFO, WARNING or ERROR (env BOOTSEER_LOG_LEVEL; default: WARNING)")
    p.set_defaults(run=_run_agent)
    _explain_agent_flags(p)


def _explain_agent_flags(p: argparse.ArgumentParser) -> None:
    """Each flag that sets an AgentConfig key says what the key's comment says, its
    default and its key: one text for the flag, the config file and docs/configuration.md."""
    from p2p.config import AgentConfig
    from p2p.configdoc import field_docs

    docs = {doc.name: doc for doc in field_docs(AgentConfig)}
    for action in p._actions:
        doc = docs.get(action.dest)
        if doc is None:
            continue
        default = "unset" if doc.default is None else repr(doc.default)
        action.help = (f"{action.help or doc.doc} (default: {default}; "
                       f"agent.toml key {doc.name})").lstrip()


def _run_agent(args: argparse.Namespace) -> int:
    from p2p.auth import SecretError, load_secret
    from p2p.config import load_agent_config
    from p2p.configfile import ConfigError

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags = {k: v for k, v in vars(args).items()
             if k not in {"config_file", "log_level", "run", "command"}}
    try:
        config = load_agent_config(getattr(args, "config_file", None), overrides=flags)
        secret = load_secret(config.secret_file)
    except (ConfigError, SecretError) as exc:
        raise UserError(str(exc)) from exc
    return uvloop.run(_serve_agent(config, secret))


GC_THRESHOLDS = (20_000, 20, 20)  # Python's defaults: (700, 10, 10)
STOP_BUDGET_S = 4.0  # SIGTERM to exit: the agent's stop, then the API's (under 5 s)


async def _serve_agent(config: Any, secret: bytes) -> int:
    from aiohttp import web

    # Store work runs in worker threads; when one wants the GIL back while the event
    # loop runs, it waits out the switch interval (5 ms by default), and each chunk's
    # reply to a peer waits with it. 0.5 ms keeps that wait below a chunk's send time.
    sys.setswitchinterval(SWITCH_INTERVAL_S)

    from p2p.agent import Agent
    from p2p.localapi import (
        ApiSocketError,
        bind_api_socket,
        make_app,
        release_api_socket,
    )
    from p2p.store import StoreError

    sock_path = Path(config.api_socket)
    try:  # before anything else: a second agent on the same path must not start at all
        api_sock, bound = bind_api_socket(sock_path, config.api_group)
    except ApiSocketError as exc:
        raise UserError(str(exc)) from exc
    try:
        agent = Agent(config, secret)
    except OSError as exc:
        release_api_socket(sock_path, bound)
        raise UserError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from exc
    except StoreError as exc:
        release_api_socket(sock_path, bound)
        raise UserError(str(exc)) from exc
    await agent.start()
    runner = web.AppRunner(make_app(agent), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.SockSite(runner, api_sock).start()
    # What exists now (modules, the agent, the API) lives as long as the process: keep
    # the collector from walking it again on each full collection, and collect the
    # young generation less often (a chunk's events, futures and frames are thousands
    # of short-lived objects that reference counting frees anyway). py-spy of an
    # uncapped round: gc_collect_main was 2.5-5% of an agent's samples.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    metrics_url = None
    if config.metrics_port is not None:
        try:
            metrics_url = await _serve_metrics(agent, config.host, config.metrics_port)
        except OSError as exc:
            await agent.stop()
            raise UserError(f"cannot serve metrics on {config.host}:{config.metrics_port}: "
                            f"{exc.strerror}") from exc
    mirror = None
    if config.mirror is not None:
        from p2p.mirror import serve_mirror

        try:
            mirror = await serve_mirror(agent, config.mirror, config.mirror_upstream)
        except (ValueError, OSError) as exc:
            await agent.stop()
            raise UserError(f"cannot serve the registry mirror on {config.mirror}: "
                            f"{getattr(exc, 'strerror', None) or exc}") from exc
    assert agent.me is not None
    print(json.dumps({"event": "listening", "peer": agent.me.peer, "addr": agent.me.addr,
                      "api_socket": str(sock_path), "metrics": metrics_url,
                      "mirror": mirror and mirror.url, "pid": os.getpid()}), flush=True)
    registered = discovery.register(sock_path)
    try:
        await _until_signalled()
    finally:
        discovery.unregister(registered)
    release_api_socket(sock_path, bound)
    try:
        async with asyncio.timeout(STOP_BUDGET_S):
            await agent.stop()  # fails every waiter: open requests are answered at once
            await runner.cleanup()
            if mirror is not None:
                await mirror.runner.cleanup()
    except TimeoutError:
        logging.getLogger(__name__).warning("stop took over %.0f s; exiting anyway",
                                            STOP_BUDGET_S)
    return 0


async def _serve_metrics(agent: Any, host: str, port: int) -> str:
    """GET /metrics over TCP for Prometheus; the rest of the API stays on the socket."""
    from aiohttp import web

    from p2p.localapi import make_metrics_app
    from p2p.peer import listen_socket

    sock = listen_socket(host, port)
    runner = web.AppRunner(make_metrics_app(agent), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return f"http://{host}:{sock.getsockname()[1]}/metrics"


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _run_origin(args: argparse.Namespace) -> int:
    from p2p.origin.server import start

    if not args.root.is_dir():
        raise UserError(f"{args.root} is not a directory")

    async def main() -> None:
        runner, _ = await start(args.root, args.host, args.port, args.rate_mbps)
        try:
            await _until_signalled()
        finally:
            await runner.cleanup()

    try:
        uvloop.run(main())
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
    return 0


def _run_publish(args: argparse.Namespace) -> int:
    from p2p.auth import SecretError, load_secret
    from p2p.publish import manifest_of_file
    from p2p.tracker_client import TrackerClient, TrackerError, TrackerUnavailable, check_name

    if not args.path.is_file():
        raise UserError(f"{args.path} is not a file")
    try:
        secret = load_secret()
    except SecretError as exc:
        raise UserError(str(exc)) from exc
    if args.name is not None:
        try:
            check_name(args.name)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    manifest = manifest_of_file(args.path, args.chunk_size_mb * MiB, args.origin, args.digest)

    async def put() -> None:
        if args.origin_check:
            await _check_origin(manifest, args.path)
        async with TrackerClient(args.tracker, secret) as tracker:
            await tracker.put_manifest(manifest)
            if args.name is not None:
                await tracker.put_name(args.name, manifest.content_id)

    try:
        asyncio.run(put())
    except (TrackerUnavailable, TrackerError) as exc:
        raise UserError(str(exc)) from exc
    print(manifest.content_id)
    return 0


async def _check_origin(manifest: Manifest, path: Path) -> None:
    """Read the last chunk from the origin and verify it: a mistyped URL, a dead server or
    another file is said now, before anything is published, not by every `get` later."""
    from p2p.origin import OriginError, OriginPool

    if not manifest.chunks:
        return
    last = manifest.chunks - 1
    buf = bytearray(manifest.chunk_length(last))
    pool = OriginPool(concurrency=1)
    try:
        await pool.read_into((manifest.origin,), manifest.chunk_offset(last), memoryview(buf))
    except OriginError as exc:
        raise UserError(f"the origin cannot serve {path}: {exc}; nothing was published "
                        "(fix --origin, or pass --no-origin-check)") from None
    finally:
        await pool.close()
    if not manifest.verify(last, buf):
        raise UserError(f"the origin's copy at {manifest.origin} is not {path} (its last "
                        f"{len(buf)} bytes differ); nothing was published")


def _content_id(text: str, tracker_url: str) -> str:
    """`text` if it is a content id, else the id the tracker's name `text` stands for."""
    from p2p.content import ManifestError, check_content_id
    from p2p.tracker_client import TrackerClient, TrackerError, TrackerUnavailable, check_name

    try:
        return check_content_id(text)
    except ManifestError:
        pass
    try:
        check_name(text)
    except ValueError:
        raise UserError(f"{text!r} is neither a content id (c1- and 64 hex digits) "
                        "nor a name") from None

    async def look_up() -> str:
        async with TrackerClient(tracker_url, load_secret()) as tracker:
            return str(await tracker.get_name(text))

    try:
        return asyncio.run(look_up())
    except TrackerError as exc:
        if exc.status == 404:
            raise UserError(f"no content is named {text!r} at {tracker_url}") from None
        raise UserError(str(exc)) from None
    except TrackerUnavailable as exc:
        raise UserError(str(exc)) from None


def _run_get(args: argparse.Namespace) -> int:
    from p2p.agentclient import AgentClient, AgentError
    from p2p.progress import while_fetching

    args.content = _content_id(args.content, args.tracker)

    async def get() -> dict[str, Any]:
        async with AgentClient(find_api_socket(args.api_socket)) as client:
            info = dict(await while_fetching(client, f"get {args.content[:15]}",
                                             [args.content], client.ensure(args.content)))
            if args.out:
                with open(args.out, "wb") as out:
                    for offset in range(0, info["size"], 64 * MiB):
                        n = min(64 * MiB, info["size"] - offset)
                        await client.read_to(args.content, offset, n, out.write)
            return info

    try:
        info = asyncio.run(get())
    except AgentError as exc:
        raise UserError(str(exc)) from exc
    print(json.dumps({"content": args.content, **info}))
    return 0


def _run_status(args: argparse.Namespace) -> int:
    from p2p.agentclient import AgentClient, AgentError

    content = None if args.content is None else _content_id(args.content, args.tracker)

    async def status() -> dict[str, Any]:
        async with AgentClient(find_api_socket(args.api_socket), timeout_s=10) as client:
            return await client.status()

    try:
        answer = asyncio.run(status())
    except AgentError as exc:
        raise UserError(str(exc)) from exc
    if content is not None:
        info = answer["contents"].get(content)
        if info is None:
            raise UserError(f"the agent at {answer.get('peer')} holds nothing of {content} "
                            "(`bootseer get` fetches it)")
        answer = {"content": content, **({"name": args.content} if args.content != content
                                         else {}), **info}
    print(json.dumps(answer, indent=2))
    return 0
