"""The server's own data-plane address and MAC, read from the kernel.

The controller needs the MAC to set `dl_dst` on the last hop, and the
rewrite needs the address to DNAT to; asking the operator for both would
invite typos, so they are looked up (`ip -j addr`) unless given.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess


def _interfaces() -> list[dict]:
    out = subprocess.run(["ip", "-j", "addr", "show"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def interface_of(address: str) -> tuple[str, str] | None:
    """(interface name, MAC) of the interface holding `address`, if any."""
    for intf in _interfaces():
        for info in intf.get("addr_info", []):
            if info.get("local") == address:
                return intf["ifname"], intf.get("address", "")
    return None


def first_global_ipv4() -> str | None:
    """The first non-loopback IPv4 address: the data-plane address of a
    Mininet host or a one-NIC server."""
    for intf in _interfaces():
        for info in intf.get("addr_info", []):
            if info.get("family") == "inet" and not ipaddress.ip_address(info["local"]).is_loopback:
                return info["local"]
    return None
