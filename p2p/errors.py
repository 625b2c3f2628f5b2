"""The errors a user is shown as one line, never as a traceback.

`UserError` is an expected failure: bad input, a missing server, a full disk. The
`bootseer` dispatcher (p2p.cli) catches it once and prints it with exit status 2.
Modules raise it, or a subclass of their own, where they know what the user must
do; errors that mean a bug stay ordinary exceptions and keep their traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An expected failure: bad input or a missing server. Printed, not traced."""


class RemoteError(UserError):
    """An expected failure on the other side: a tracker, an agent, a peer, an origin
    (registry, HDFS, HTTP) failed, refused or answered wrongly; the message names it."""
