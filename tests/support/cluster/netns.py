"""The real node's network: a network namespace the cluster creates, joined to the host by a veth.

Traffic may go only to loopback or into namespaces we create, so nothing of the node touches the
machine's own interfaces: containerd, kubelet, kube-proxy, CoreDNS and every pod live in
`llmtrain-<id>`. A veth pair carries a private /30 (host end `.1`, node end `.2`, the node's
InternalIP); the namespace has no default route, so a pod cannot send a packet anywhere else, and
Service IPs route to its loopback (a packet kube-proxy does not rewrite goes nowhere).

The API server keeps listening on the host's 127.0.0.1. `relay` (a process of this module) opens
its listening socket inside the namespace, on the node's IP and the API server's port, and connects
to 127.0.0.1 from the host's namespace: the node's components use `https://<node IP>:<port>`, and
the API server advertises that address, so pods reach it through the `kubernetes` Service. The API
server reaches the kubelet (logs, exec) at the node's IP through the veth.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import hashlib
import ipaddress
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
# Private ranges that exist only inside our namespaces (and the host end of each veth).
LINK_RANGE = ipaddress.IPv4Network("10.203.0.0/16")
SERVICE_RANGE = "10.96.0.0/16"


@dataclass(frozen=True)
class NodeNetwork:
    name: str  # the namespace: /run/netns/<name>
    host_link: str
    host_ip: str
    node_ip: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return _ip("netns", "exec", self.name, *argv)

    def enter(self, argv: list[str]) -> list[str]:
        """argv run in the namespace's network only (not `ip netns exec`, which also gives the
        process its own mount namespace: kubelet's volume mounts must be seen by containerd)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _used_addresses() -> set[ipaddress.IPv4Address]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    found: set[ipaddress.IPv4Address] = set()
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            found.add(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).ip)
    return found


def create(directory: Path) -> NodeNetwork:
    """The namespace, veth and routes for the cluster in `directory` (its name hashes the path)."""
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()
    name, link = f"llmtrain-{key[:8]}", f"llt{key[:8]}"
    used = _used_addresses()
    subnets = list(LINK_RANGE.subnets(new_prefix=30))
    start = int(key[8:16], 16) % len(subnets)
    for i in range(len(subnets)):
        subnet = subnets[(start + i) % len(subnets)]
        host_ip, node_ip = list(subnet.hosts())
        if host_ip not in used and node_ip not in used:
            break
    else:
        raise RuntimeError(f"no free /30 left in {LINK_RANGE}")
    net = NodeNetwork(name, link, str(host_ip), str(node_ip))
    delete(net.name)
    _ip("netns", "add", name)
    _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
    _ip("addr", "add", f"{host_ip}/30", "dev", link)
    _ip("link", "set", link, "up")
    for cmd in (
        ("ip", "link", "set", "lo", "up"),
        ("ip", "addr", "add", f"{node_ip}/30", "dev", "eth0"),
        ("ip", "link", "set", "eth0", "up"),
        # A route for Service IPs, so that a local connect() gets as far as kube-proxy's DNAT; what
        # it does not rewrite dies on the namespace's loopback (no dummy driver on this kernel).
        ("ip", "route", "add", SERVICE_RANGE, "dev", "lo"),
        ("sysctl", "-qw", "net.ipv4.ip_forward=1"),
    ):
        net.run(*cmd)
    return net


def delete(name: str) -> None:
    """Remove the namespace (its veth, bridge, iptables rules go with it)."""
    if Path(f"/run/netns/{name}").exists():
        _ip("netns", "delete", name)


# ---- the API server relay ---------------------------------------------------------------------
def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


@contextlib.contextmanager
def inside(netns_path: str) -> Iterator[None]:
    """Run this thread in another network namespace for the block: a socket made there stays
    there (setns moves only the calling thread, so other threads are unaffected)."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def listen_in(netns_path: str, host: str, port: int) -> socket.socket:
    """A listening socket bound inside another network namespace."""
    with inside(netns_path):
        return socket.create_server((host, port), reuse_port=False)


def connect_in(netns_path: str, host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection made from inside another network namespace (its routes, kube-proxy's
    rules for locally made connections), usable from any thread once returned."""
    with inside(netns_path):
        return socket.create_connection((host, port), timeout=timeout)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


async def _relay(listener: socket.socket, target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="relay a TCP port from a network namespace to 127.0.0.1")
    parser.add_argument("--netns", required=True, help="/run/netns/<name>")
    parser.add_argument("--listen", required=True, help="IP inside the namespace")
    parser.add_argument("--port", type=int, required=True, help="listen port and 127.0.0.1's port")
    args = parser.parse_args()
    listener = listen_in(args.netns, args.listen, args.port)
    asyncio.run(_relay(listener, ("127.0.0.1", args.port)))


if __name__ == "__main__":
    main()
