"""Which addresses count as public, for the two places the portal reaches
out where a user chose the destination: webhooks (jobs/webhooks.py) and
image registries (jobs/images.py). Pure: no Django, no I/O.

An IPv6 address can stand for an IPv4 one (IPv4-mapped, 6to4, Teredo,
NAT64): where such a route exists, connecting to it reaches that IPv4
address, so it is judged as that address.
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 6052's well-known NAT64 prefix carries the IPv4 address in its last 32
# bits; the local-use prefix (RFC 8215) may carry it anywhere, so it is
# never taken for public.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: Address) -> bool:
    """Globally routable, not multicast, and not standing for an address
    that is not (loopback, private, link-local with the cloud metadata
    address, shared 100.64/10, reserved ...)."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64_LOCAL:
        return False
    embedded = embedded_ipv4(address)
    return embedded is None or is_public(embedded)
