"""WebHDFS errors are one line: a server that is not WebHDFS is named as such, not quoted."""

from __future__ import annotations

import json

from hdfs_stripe.webhdfs import HdfsNotFound, _status_error

HTML_404 = ("<html>\n<head><title>404 Not Found</title></head>\n<body>\n"
            "<center><h1>404 Not Found</h1></center>\n</body>\n</html>\n")


def test_another_servers_page_is_not_quoted_and_the_port_is_questioned() -> None:
    error = _status_error(404, HTML_404, "/ckpt/a", "root")
    text = str(error)
    assert "<" not in text and "\n" not in text
    assert "does not answer as WebHDFS" in text and "9870" in text
    assert not isinstance(error, HdfsNotFound)  # nothing says the file is missing


def test_a_webhdfs_404_still_says_the_file_does_not_exist() -> None:
    body = json.dumps({"RemoteException": {"exception": "FileNotFoundException",
                                           "message": "File does not exist: /ckpt/a\nat x"}})
    error = _status_error(404, body, "/ckpt/a", "root")
    assert isinstance(error, HdfsNotFound)
    assert str(error) == "/ckpt/a does not exist in HDFS (File does not exist: /ckpt/a)"
