"""Hosts for fault tests: each in its own network namespace, all on one bridge, made with iproute2 and broken
with iptables and ``ip link``. The bridge lives in a namespace of its own too, so nothing of this machine's
network is touched: every address is inside the namespaces, and closing the network deletes them all."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

SUBNET = "10.231.0"  # a /24 that exists only inside the namespaces


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why these tests cannot run here, or None: they need root, ``ip netns`` and iptables."""
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"tfprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        subprocess.run(["ip", "netns", "exec", probe, "iptables", "-S"], check=True, capture_output=True)
    except subprocess.CalledProcessError as error:
        return f"network namespaces or iptables are not permitted here: {error.stderr.strip()[:200]}"
    finally:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


class Network:
    """A switch (a bridge in its own namespace) and hosts, each a namespace with one veth ``eth0`` on it."""

    def __init__(self) -> None:
        self.prefix = f"tf{os.getpid()}"  # parallel runs get their own namespaces
        self.switch = f"{self.prefix}sw"
        self.hosts: dict[str, str] = {}  # name -> address
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def namespace(self, host: str) -> str:
        return f"{self.prefix}{host}"

    def add(self, host: str, number: int) -> str:
        """A host at SUBNET.number; its address."""
        namespace, address = self.namespace(host), f"{SUBNET}.{number}"
        self.hosts[host] = address  # from here on close() deletes it
        _ip("netns", "add", namespace)
        _ip("-n", self.switch, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("-n", self.switch, "link", "set", host, "master", "br0", "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        return address

    def unplug(self, host: str) -> None:
        """The host's link deleted (both ends): from the network's side, a node that vanished."""
        subprocess.run(["ip", "-n", self.switch, "link", "delete", host], capture_output=True)

    def remove(self, host: str) -> None:
        """The host's namespace deleted; it is gone once the last process inside has exited."""
        self.unplug(host)
        self.hosts.pop(host, None)
        subprocess.run(["ip", "netns", "delete", self.namespace(host)], capture_output=True)

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """argv run inside the host's namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def blackhole(self, host: str, on: bool) -> None:
        """Every packet to and from the host dropped (on), or let through again."""
        action = "-I" if on else "-D"
        for chain, direction in (("INPUT", "-i"), ("OUTPUT", "-o")):
            rule = ["iptables", action, chain, direction, "eth0", "-j", "DROP"]
            subprocess.run(self.command(host, rule), check=True, capture_output=True)

    def link(self, host: str, up: bool) -> None:
        _ip("-n", self.namespace(host), "link", "set", "eth0", "up" if up else "down")

    def close(self) -> None:
        """Every namespace deleted (their links and iptables rules go with them)."""
        for host in list(self.hosts):
            self.remove(host)
        subprocess.run(["ip", "netns", "delete", self.switch], capture_output=True)
