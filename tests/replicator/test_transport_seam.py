"""The protocol modules reach the network only through `replicator/transport.py`: none
of them imports a socket, TLS or asyncio's streams and servers, so a transport put in at
the seam (the in-memory one) is the whole network they see. TCP is named only as the
default where no transport is given."""

from __future__ import annotations

import ast
from pathlib import Path

from testkit.procs import REPO

PROTOCOL = ["replicator/source.py", "replicator/client.py", "replicator/upstream.py",
            "replicator/bootstrap.py", "replicator/handshake.py"]  # fmt: skip
#: Network modules and the asyncio names that open, serve or read connections.
FORBIDDEN_MODULES = {"socket", "ssl", "selectors", "asyncio.sslproto", "net.tcp"}
FORBIDDEN_ASYNCIO = {"open_connection", "start_server", "create_server", "create_connection",
                     "StreamReaderProtocol", "sock_recv", "sock_sendall", "sendfile"}  # fmt: skip
#: `read_welcome` reads a raw StreamReader for tests of the wire itself.
ALLOWED = {("replicator/upstream.py", "StreamReader")}


def _uses(path: str) -> set[str]:
    tree = ast.parse((Path(REPO) / path).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in FORBIDDEN_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
            found.add(node.module)
        elif (
            isinstance(node, ast.Attribute)
            and (node.attr in FORBIDDEN_ASYNCIO or node.attr in {"StreamReader", "StreamWriter"})
            and (path, node.attr) not in ALLOWED
        ):
            found.add(node.attr)
    return found


def test_the_protocol_modules_use_only_the_transport_seam() -> None:
    assert {p: _uses(p) for p in PROTOCOL} == {p: set() for p in PROTOCOL}
