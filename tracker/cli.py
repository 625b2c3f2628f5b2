"""`bootseer tracker`: run the tracker service until SIGTERM or SIGINT.

Once the socket is listening the command prints exactly one JSON line on
stdout, `{"event": "listening", "url": "http://HOST:PORT"}`, so a supervisor
or a test can start it with `--port 0` and learn the port it got. Logs go to
stderr. Expected failures (bad config, no secret, port in use, unusable state
dir) are one-line UserErrors, never tracebacks.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import json
import logging
import signal
import sys
from collections.abc import Awaitable
from typing import Any

import uvloop
from aiohttp import web

from p2p.auth import SecretError, load_secret
from p2p.configfile import ConfigError
from p2p.errors import UserError
from tracker.config import TrackerConfig, config_keys, load_config
from tracker.handout import HANDOUT_POLICIES

log = logging.getLogger("bootseer.tracker")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer tracker`."""
    p = sub.add_parser("tracker", help="run the tracker (control plane)",
                       description=__doc__.splitlines()[0])
    s = argparse.SUPPRESS  # only flags actually passed override the config file
    p.add_argument("--config", metavar="FILE", help="TOML file with TrackerConfig keys")
    p.add_argument("--host", default=s, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=s, help="TCP port; 0 picks a free one "
                   "(default 7070)")
    p.add_argument("--state-dir", dest="state_dir", default=s, metavar="DIR",
                   help="directory where published manifests persist across restarts")
    p.add_argument("--secret-file", dest="secret_file", default=s, metavar="FILE",
                   help="cluster secret (default: $BOOTSEER_SECRET_FILE or $BOOTSEER_SECRET)")
    p.add_argument("--handout-policy", dest="handout_policy", default=s,
                   choices=sorted(HANDOUT_POLICIES), help="peer handout policy "
                   "(default rack_aware)")
    p.add_argument("--handout-limit", dest="handout_limit", type=int, default=s,
                   metavar="N", help="most peers per announce reply (default 30)")
    p.add_argument("--announce-interval", dest="announce_interval_seconds", type=float,
                   default=s, metavar="SECONDS", help="announce period told to agents "
                   "(default 2.0)")
    p.add_argument("--peer-ttl", dest="peer_ttl_seconds", type=float, default=s,
                   metavar="SECONDS", help="silence before a peer is dropped (default 10.0)")
    p.add_argument("--origin-fetchers", dest="origin_fetchers", type=int, default=s,
                   metavar="N", help="members per content that fetch from the origin "
                   "(default 4)")
    p.add_argument("--fetcher-stall", dest="fetcher_stall_seconds", type=float, default=s,
                   metavar="SECONDS", help="an origin fetcher this long without progress "
                   "loses its slot (default 10.0)")
    p.add_argument("--fetcher-start", dest="fetcher_start_seconds", type=float, default=s,
                   metavar="SECONDS", help="an appointed origin fetcher this long without its "
                   "first progress loses its slot (default 1.5 announce intervals)")
    p.add_argument("--max-connections", dest="max_connections", type=int, default=s,
                   metavar="N", help="open connections at once; beyond, 503 (default 4096)")
    p.add_argument("--header-timeout", dest="header_timeout_seconds", type=float, default=s,
                   metavar="SECONDS", help="time to send a request head, from accept or the "
                   "previous reply; also the keep-alive idle limit (default 20.0)")
    p.add_argument("--body-timeout", dest="body_timeout_seconds", type=float, default=s,
                   metavar="SECONDS", help="time to send a request body (default 20.0)")
    p.add_argument("--redis", dest="redis_url", default=s, metavar="URL",
                   help="share swarm state with other tracker replicas through the Redis "
                   "at URL (redis://HOST:PORT/DB, or rediss:// for TLS); default: one "
                   "process, in memory")
    p.add_argument("--redis-prefix", dest="redis_prefix", default=s, metavar="PREFIX",
                   help="Redis key prefix: replicas of one cluster share it (default "
                   "bootseer)")
    p.add_argument("--redis-password-file", dest="redis_password_file", default=s,
                   metavar="FILE", help="Redis AUTH password, read from FILE (required with "
                   "--redis)")
    p.add_argument("--redis-user", dest="redis_username", default=s, metavar="USER",
                   help="Redis ACL user (default: Redis's default user)")
    p.add_argument("--redis-ca-file", dest="redis_ca_file", default=s, metavar="FILE",
                   help="CA certificates that sign Redis's TLS certificate (with a "
                   "rediss:// URL)")
    p.add_argument("--seed", type=int, default=s, help="handout rng seed (default random)")
    p.add_argument("--log-level", dest="log_level", default=s,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                   help="stderr log level (default INFO)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    overrides = {k: getattr(args, k) for k in config_keys() if hasattr(args, k)}
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        secret = load_secret(config.secret_file)
    except SecretError as exc:
        raise UserError(str(exc)) from None
    return uvloop.run(serve(config, secret))


async def serve(config: TrackerConfig, secret: bytes) -> int:
    """Listen, announce the URL on stdout, and serve until SIGTERM or SIGINT."""
    from tracker.app import TRACKER, make_app  # after logging is set up; keeps `--help` fast
    from tracker.guard import Unavailable, listen, runner_options

    try:
        app = make_app(config, secret)
    except OSError as exc:
        raise UserError(f"cannot use state dir {config.state_dir}: "
                        f"{exc.strerror or exc}") from None
    access_log: Any = logging.getLogger("aiohttp.access") if config.log_level == "DEBUG" else None
    runner = web.AppRunner(app, handle_signals=False, access_log=access_log,
                           **runner_options(config))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the listening line: no race
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
    except Unavailable as exc:
        raise UserError(str(exc)) from None
    _freeze_startup_objects()
    try:
        t = app[TRACKER]
        server = await _listen(listen(runner, config, t.guard, t.metrics.refused_connections),
                               config)
        await stop.wait()
        log.info("shutting down")
        server.close()
    finally:
        await runner.cleanup()
    return 0


def _freeze_startup_objects() -> None:
    """Keep what importing and setting up made out of the collector's full passes.

    The registry holds a tracked object per member, each replaced at every
    announce, so full collections come every few seconds under load; each one
    also walked the ~40,000 objects of the loaded modules and the app, which
    never become garbage. Measured at 10,000 x 3: full passes of 120-140 ms
    before, 15-27 ms after (the p99 is made of them).
    """
    gc.collect()
    gc.freeze()


async def _listen(starting: Awaitable[asyncio.Server],
                  config: TrackerConfig) -> asyncio.Server:
    try:
        server = await starting
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {config.port} on {config.host} is in use; stop the other "
                            "process, or pick another port with --port (0 = any free port)"
                            ) from None
        raise UserError(f"cannot listen on {config.host}:{config.port}: "
                        f"{exc.strerror or exc}") from None
    port = server.sockets[0].getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{port}"
    print(json.dumps({"event": "listening", "url": url}), flush=True)
    log.info("tracker listening on %s (handout policy %s, state dir %s)",
             url, config.handout_policy, config.state_dir or "none: memory only")
    return server
