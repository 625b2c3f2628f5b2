"""The agent's `hdfs://` origin adapter: a chunk of a checkpoint content is a stripe,
read from HDFS by `reader.StripeReader` (replica-aware, resumes on another replica).

The agent loads this adapter through the `bootseer.origins` entry point (see
pyproject.toml) the first time a manifest's origin is an `hdfs://` URL; p2p
never imports it. The URL pins one version of the file (`naming.origin_url`):
a file replaced or appended since is reported as changed, never read.

Who reads: `HADOOP_USER_NAME` (simple auth; default the agent's user) or, when
`BOOTSEER_HDFS_DELEGATION` is set, that delegation token.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping

from hdfs_stripe.naming import FileChanged, HdfsUri, UriError, parse_origin_url, parse_uri
from hdfs_stripe.reader import StripeReader
from hdfs_stripe.stripe import PlanError
from hdfs_stripe.webhdfs import HdfsError, WebHdfs
from p2p.origin.base import OriginError, Progress


def webhdfs_for(uri: HdfsUri, user: str | None = None,
                env: Mapping[str, str] = os.environ) -> WebHdfs:
    """A WebHDFS client for the URI's NameNode, as the user the environment `env` names
    (this process's by default)."""
    return WebHdfs(uri.endpoint, user=user or env.get("HADOOP_USER_NAME")
                   or getpass.getuser(), token=env.get("BOOTSEER_HDFS_DELEGATION"))


class HdfsOrigin:
    """One NameNode as an origin (the factory the agent calls with `hdfs://host:port`)."""

    def __init__(self, endpoint: str) -> None:
        self._reader = StripeReader(webhdfs_for(parse_uri(endpoint.rstrip("/") + "/")))

    async def read_into(self, url: str, offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        """Stripes come from several DataNodes at once, not in order: no progress."""
        try:
            uri, version = parse_origin_url(url)
            await self._reader.read(uri, version, offset, view)
        except (UriError, HdfsError, FileChanged, PlanError) as exc:
            raise OriginError(str(exc)) from exc

    async def close(self) -> None:
        await self._reader.close()
