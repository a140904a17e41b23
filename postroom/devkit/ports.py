"""TCP ports on the loopback address, for the servers the tests, the bench and the demo start: free
ones to start them on, and whether one accepts connections yet (or still)."""

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


def listening(port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on the loopback ``port`` within ``timeout_s``."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A port nothing listens on now."""
    [port] = free_ports(1)
    return port
