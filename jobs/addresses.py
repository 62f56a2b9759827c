"""Which addresses count as public, for the two places the portal reaches
out where a user chose the destination: webhooks (jobs/webhooks.py) and
image registries (jobs/images.py). Pure: no Django, no I/O.

An IPv6 address can stand for an IPv4 one (IPv4-mapped, 6to4, Teredo,
NAT64): where such a route exists, connecting to it reaches that IPv4
address, so it is judged as that address. Forms that no public route
reaches, or that a stack may turn into an IPv4 address of its own choosing
(IPv4-compatible, site-local, scoped), are never public (finding 28).
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 6052's well-known NAT64 prefix carries the IPv4 address in its last 32
# bits; the local-use prefix (RFC 8215) may carry it anywhere, so it is
# never taken for public.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")

# Never public, whatever the running Python's `is_global` says of them (its
# tables change between versions; 3.11 takes the first two for global):
# the IPv4-compatible (::a.b.c.d, deprecated, with :: and ::1 in it) and
# IPv4-translated (::ffff:0:a.b.c.d) forms, which a stack may still route to
# that IPv4 address (IPv4-mapped ones are judged as their IPv4 address
# before this); fec0::/10 is site-local (deprecated, still routed inside
# some sites); Teredo's 2001::/32 relays to a client behind a NAT, an
# address of its choosing.
_NEVER_PUBLIC = (
    ipaddress.IPv6Network("::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
    ipaddress.IPv6Network("fec0::/10"),
    ipaddress.IPv6Network("2001::/32"),
    _NAT64_LOCAL,
)


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
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped:
            return is_public(address.ipv4_mapped)
        # A zone (fe80::1%eth0) names one of this machine's interfaces: no
        # public destination needs one.
        if address.scope_id is not None or any(address in network for network in _NEVER_PUBLIC):
            return False
    if not address.is_global or address.is_multicast:
        return False
    embedded = embedded_ipv4(address)
    return embedded is None or is_public(embedded)
