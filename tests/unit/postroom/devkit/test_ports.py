"""Free ports: distinct, and free to bind."""

from __future__ import annotations

import socket

from postroom.devkit.ports import HOST, free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in [*ports, free_port()]:
        with socket.socket() as sock:
            sock.bind((HOST, port))
