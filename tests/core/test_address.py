"""Addresses of either IP family: what a user may type (an IPv6 host in brackets, as in a
URL), which family a socket reaches it over, and this host's address towards it."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from zres.agent.data.server import _advertised, default_listen
from zres.agent.ranks import free_port, master_address
from zres.core import net
from zres.core.address import is_local, normalize, parse_http_address, unreachable


@pytest.mark.parametrize(("given", "taken"), [
    ("tcp://[::1]:7070", "tcp://[::1]:7070"),
    ("[::1]:7070", "tcp://[::1]:7070"),
    ("tcp://[::]:7070", "tcp://[::]:7070"),
    ("tcp://[2001:db8::5]:7070", "tcp://[2001:db8::5]:7070"),
    ("tcp://[fe80::1%eth0]:7070", "tcp://[fe80::1%eth0]:7070"),
    ("tcp://*:7070", "tcp://*:7070"),
])
def test_an_ipv6_address_in_brackets_is_taken(given, taken):
    assert normalize(given) == taken
    assert net.host_port(taken)[1] == 7070


@pytest.mark.parametrize(("given", "says"), [
    ("tcp://::1:7070", "tcp://[::1]:7070"),
    ("::1:7070", "[::1]:7070"),
    ("tcp://2001:db8::5:7070", "tcp://[2001:db8::5]:7070"),
    ("tcp://fe80::1", "tcp://[fe80::1]:PORT"),
])
def test_an_ipv6_address_without_brackets_is_refused_saying_how_to_write_it(given, says):
    with pytest.raises(ValueError) as refused:
        normalize(given)
    assert str(refused.value) == (f"{given!r}: an IPv6 address goes in brackets, its port "
                                  f"after them: {says}")


def test_a_link_local_address_without_its_zone_is_refused_saying_so():
    """(fe80::/10 is on every link: libzmq's bind says `Invalid argument`, its connect
    retries for ever.)"""
    with pytest.raises(ValueError) as refused:
        normalize("[fe80::1]:7070")
    assert str(refused.value) == ("'tcp://[fe80::1]:7070': a link-local IPv6 address needs "
                                  "its zone, the interface it is on: e.g. "
                                  "tcp://[fe80::1%eth0]:7070")


def test_brackets_hold_an_ipv6_address_or_nothing():
    for given in ("tcp://[127.0.0.1]:7070", "tcp://[broker]:7070"):
        with pytest.raises(ValueError, match=r"is not an IPv6 address \(brackets are"):
            normalize(given)
    with pytest.raises(ValueError, match="needs a host and a port"):
        normalize("tcp://[::1]")
    with pytest.raises(ValueError, match="port 99999 is past 65535"):
        normalize("tcp://[::1]:99999")


def test_the_dashboards_address_may_be_ipv6_in_brackets():
    assert parse_http_address("[::1]:8787") == ("::1", 8787)
    assert parse_http_address("http://[::]:8787/") == ("::", 8787)
    assert parse_http_address("[fe80::1%eth0]:8787") == ("fe80::1%eth0", 8787)  # (its zone)
    with pytest.raises(ValueError, match=r"in brackets, its port after them: \[::1\]:8787"):
        parse_http_address("::1:8787")


def test_ipv6_loopback_is_local_and_every_address_is_not():
    assert is_local("tcp://[::1]:7070") and is_local("tcp://[::ffff:127.0.0.1]:7070")
    assert not is_local("tcp://[::]:7070") and not is_local("tcp://[2001:db8::5]:7070")


def test_a_socket_reaches_over_ipv6_only_what_ipv4_would_not(monkeypatch):
    """(A name with both families is reached over IPv4, as ever: libzmq told IPv6 dials
    ``localhost`` at ::1 where /etc/hosts says so, while a broker listens on 127.0.0.1.)"""
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):  # (a name only DNS could give: none here)
        if host == "v6only.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::5", 0, 0, 0))]
        if host == "both.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::5", 0, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.5", 0))]
        if host == "nowhere.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    over_v6 = ["tcp://[::1]:1", "tcp://[::]:1", "tcp://*:1", "tcp://v6only.example:1",
               "tcp://nowhere.example:1"]  # (DNS may come later; IPv4 ones are mapped)
    over_v4 = ["tcp://127.0.0.1:1", "tcp://0.0.0.0:1", "tcp://localhost:1",
               "tcp://both.example:1", "tcp://lo:1", "ipc:///tmp/x"]
    assert [a for a in over_v6 if not net.ipv6(a)] == []
    assert [a for a in over_v4 if net.ipv6(a)] == []


def test_this_host_is_advertised_towards_an_ipv6_broker_by_its_ipv6_address():
    """The data port, a job's master (bare, for torch's MASTER_ADDR) and the default data
    port's address follow the broker's family."""
    assert net.towards("tcp://[::1]:7070") == "::1"
    assert master_address("tcp://[::1]:7070") == "::1"
    assert master_address("tcp://127.0.0.1:7070") == "127.0.0.1"
    assert master_address("ipc:///tmp/broker.sock") == "127.0.0.1"
    assert _advertised("tcp://[::]:5555", "tcp://[::1]:7070") == "tcp://[::1]:5555"
    assert _advertised("tcp://0.0.0.0:5555", "tcp://127.0.0.1:7070") == "tcp://127.0.0.1:5555"
    assert default_listen("tcp://[::1]:7070") == "tcp://[::1]:0"
    assert default_listen("tcp://[2001:db8::5]:7070") == "tcp://*:0"
    assert default_listen("tcp://192.0.2.5:7070") == "tcp://0.0.0.0:0"
    assert default_listen("tcp://127.0.0.1:7070") == "tcp://127.0.0.1:0"
    # (loopback however written: never every interface for a broker on loopback)
    assert default_listen("tcp://[::ffff:127.0.0.1]:7070") == "tcp://127.0.0.1:0"
    assert default_listen("tcp://[0:0::1]:7070") == "tcp://[::1]:0"
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", free_port("::1")))  # (free over IPv6)


def test_a_link_local_address_advertised_names_its_zone():
    """(fe80::/10 is on every link: without its interface, zmq cannot dial it.)"""
    try:
        with open("/proc/net/if_inet6") as fh:  # address, index, prefix, scope, flags, name
            local = [(line.split()[0], line.split()[5]) for line in fh
                     if line.split()[3] == "20"]
    except OSError:
        local = []
    if not local:
        pytest.skip("no link-local IPv6 address here")
    digits, name = local[0]
    mine = str(ipaddress.IPv6Address(int(digits, 16)))
    assert net.towards(f"tcp://[{mine}%{name}]:7070") == f"{mine}%{name}"
    assert _advertised("tcp://[::]:5555", f"tcp://[{mine}%{name}]:7070") == \
        f"tcp://[{mine}%{name}]:5555"


def test_nothing_listening_at_an_ipv6_address_is_said_at_once():
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::1", 0))
        listener.listen()
        address = f"tcp://[::1]:{listener.getsockname()[1]}"
        assert unreachable(address) is None
    assert unreachable(address) == "connection refused"
