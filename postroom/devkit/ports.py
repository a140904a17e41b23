"""Free TCP ports on the loopback address, for the servers the tests, the bench and the demo start."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now, distinct from each other (all bound at once to ask)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """A port nothing listens on now."""
    [port] = free_ports(1)
    return port
