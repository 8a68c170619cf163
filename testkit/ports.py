"""Loopback ports for the servers tests, drills, benches and scripts start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_GIVEN: set[int] = set()


def free_port(span: int = 1) -> int:
    """A loopback port free to listen on, with the `span - 1` ports after it (a broker's
    controller listens on its port + 1). Chosen below the kernel's ephemeral range: a port in
    it can be taken by any outgoing connection's local end between this check and the server's
    bind (a test broker once failed on exactly that), or while a server a drill stops is down
    and starts again on the same port. Never handed out twice in one process."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) \
        if Path("/proc/sys/net/ipv4/ip_local_port_range").exists() else 32768
    for _ in range(1000):
        port = random.randrange(max(1024, low - 12000), low - span)
        ports = range(port, port + span)
        if not _GIVEN.intersection(ports) and all(_bindable(p) for p in ports):
            _GIVEN.update(ports)
            return port
    raise RuntimeError(f"no {span} free consecutive ports below {low}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
