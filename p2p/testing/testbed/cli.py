"""`bootseer testbed ...`: an emulated cluster of network namespaces on this machine.

- `testbed up --nodes N [--racks R] [--node-cap MB/s] [--origin-cap MB/s]
  [--oversubscription X | --uplink-cap MB/s] [--name NAME]`: build it (see
  `p2p.testing.testbed.plan`) and print its layout as one JSON line;
- `testbed status [--name NAME]`: the layout of the testbed that is up;
- `testbed exec [--name NAME] HOST -- CMD...`: run CMD in a host's namespace
  (`n3`, `3` or `origin`), returning its exit status;
- `testbed down [--name NAME]`: remove it (and the remains of a failed `up`).

Two testbeds up at once need different names and subnets. Needs root.
Expected failures (a bad flag value, a testbed already up, a
missing `ip`) are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess

from p2p.errors import UserError


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer testbed`."""
    p = sub.add_parser("testbed", help="an emulated cluster of network namespaces",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="action", required=True)
    u = kinds.add_parser("up", help="build the testbed; prints its layout")
    u.add_argument("--nodes", type=int, required=True, help="node namespaces to make")
    u.add_argument("--racks", type=int, default=1, help="racks the nodes are spread over")
    u.add_argument("--node-cap", dest="node_mbps", type=float, default=100.0,
                   help="MB/s per node, each way (default 100)")
    u.add_argument("--origin-cap", dest="origin_mbps", type=float, default=200.0,
                   help="MB/s in and out of the origin namespace (default 200)")
    caps = u.add_mutually_exclusive_group()
    caps.add_argument("--oversubscription", type=float, default=1.0,
                      help="rack uplink = the rack's node caps / this (default 1)")
    caps.add_argument("--uplink-cap", dest="uplink_mbps", type=float,
                      help="MB/s per rack uplink, each way")
    u.add_argument("--subnet", default="10.213.0.0/16", help="a /16 for the testbed")
    for action, text in (("status", "print the layout"), ("down", "remove the testbed")):
        kinds.add_parser(action, help=text)
    e = kinds.add_parser("exec", help="run a command in a host's namespace")
    e.add_argument("host", help="n<i>, <i> or origin")
    e.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD")
    for q in kinds.choices.values():
        q.add_argument("--name", default="bs", help="the testbed's name (default bs)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from p2p.testing.testbed import netns
    from p2p.testing.testbed.plan import Spec, SpecError

    try:
        if args.action == "up":
            bed = netns.up(Spec(args.nodes, args.racks, args.node_mbps, args.origin_mbps,
                                args.oversubscription, args.uplink_mbps, args.name,
                                args.subnet))
            print(json.dumps(bed.plan.to_dict()))
        elif args.action == "status":
            print(json.dumps(netns.find(args.name).plan.to_dict()))
        elif args.action == "down":
            removed = netns.down(args.name)
            print(f"removed {len(removed)} namespaces and links of testbed {args.name}"
                  if removed else f"no testbed {args.name} was up")
        else:
            argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not argv:
                raise UserError("exec needs a command after --")
            bed = netns.find(args.name)
            return subprocess.run(bed.command(bed.host(args.host), argv)).returncode
    except (SpecError, netns.TestbedError) as exc:
        raise UserError(str(exc)) from None
    return 0
