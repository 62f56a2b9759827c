"""Which addresses count as public (jobs/addresses.py), the webhooks' and
image registries' defence against reaching the portal's own networks
(SSRF). Finding 28: IPv6 forms that stand for an IPv4 address, or that no
public route reaches, were taken for public. Pure: literals only, nothing
is resolved or connected to."""

from __future__ import annotations

import ipaddress

import pytest

from jobs import webhooks
from jobs.addresses import is_public

NOT_PUBLIC = [
    # IPv4-mapped, as it is and in its hexadecimal spelling
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:7f00:1", "::ffff:169.254.169.254",
    # IPv4-compatible (deprecated, RFC 4291) and IPv4-translated (RFC 2765)
    "::127.0.0.1", "::10.0.0.1", "::192.168.1.1", "::ffff:0:127.0.0.1", "::ffff:0:a00:1",
    # NAT64: the well-known prefix with a private IPv4 address, the local-use prefix whatever it holds
    "64:ff9b::127.0.0.1", "64:ff9b::10.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::a00:1", "64:ff9b:1::808:808",
    # 6to4 embedding private or loopback IPv4
    "2002:7f00:1::1", "2002:a00:1::", "2002:c0a8:101::1",
    # Teredo (its client address is the last 32 bits, inverted)
    "2001:0:4136:e378:8000:63bf:80ff:fffe", "2001::1",
    # site-local (deprecated, RFC 3879), unique local, link-local, loopback, unspecified
    "fec0::1", "feff::1", "fc00::1", "fd12:3456::1", "fe80::1", "::1", "::",
    # scoped: a zone names one of this machine's interfaces, never a public destination
    "fe80::1%eth0", "fe80::1%1", "2606:4700:4700::1111%eth0",
    # IPv4 itself
    "127.0.0.1", "10.0.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
]

PUBLIC = ["2606:4700:4700::1111", "2001:4860:4860::8888", "64:ff9b::808:808", "8.8.8.8", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("text", NOT_PUBLIC)
def test_it_refuses_addresses_that_are_not_public_however_spelled(text):
    address = ipaddress.ip_address(text)
    assert not is_public(address)
    assert not webhooks.address_allowed(address, [webhooks.PUBLIC])


@pytest.mark.parametrize("text", PUBLIC)
def test_it_takes_public_addresses_for_public(text):
    assert webhooks.address_allowed(ipaddress.ip_address(text), [webhooks.PUBLIC])


@pytest.mark.parametrize("host", ["[::127.0.0.1]", "[::ffff:0:127.0.0.1]", "[fec0::1]", "[fe80::1%25eth0]",
                                  "[2606:4700:4700::1111%25eth0]", "[64:ff9b::10.0.0.1]", "[2002:a00:1::]"])
def test_a_webhook_url_with_such_a_literal_is_refused_before_any_connection(host):
    target = webhooks.parse_url(f"http://{host}:8080/hook")
    with pytest.raises(webhooks.Refused):
        webhooks.resolve(target, [webhooks.PUBLIC])  # a literal: neither looked up nor connected to
