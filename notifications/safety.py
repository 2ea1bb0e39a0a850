"""Where a person's notification address may lead: safe by default.

A person's own Apprise URL makes the worker (or the settings page's test
button) connect wherever it points, so a logged-in user could otherwise make
the site reach its own loopback services, the household's private network or a
cloud's metadata address (server-side request forgery). The rules:

1. **Schemes that make sense for a person** (``PERSON_SCHEMES``: e-mail,
   ntfy, Telegram, Signal, Matrix, Pushover, Discord, Slack, Gotify,
   Pushbullet, Mattermost, Rocket.Chat, Zulip), decided on the plugin Apprise
   picks, so a service's own https:// address (a Discord webhook) counts as
   that service. ``PIPPA_NOTIFY_ALLOW_SCHEMES`` adds more (``json`` for a
   webhook).
2. **No overrides**: no ``?method=``, no ``+Header``/``-Header`` and no
   ``:field`` arguments, which let the URL choose what is sent.
3. **Public addresses only**: the host a URL names is resolved when it is
   saved and again before each send, and every connection the send opens is
   checked on the address it really connects to (``guarded``, a socket audit
   hook), so a name that changes what it resolves to between the two is still
   refused. Loopback, private, link-local, shared, reserved, multicast and
   cloud-metadata addresses are refused; ``PIPPA_NOTIFY_ALLOW_NETWORKS``
   allows networks of the operator's choosing (a household's ntfy server),
   never a metadata address.

The site's own mail server (``PIPPA_NOTIFY_URLS``) is the operator's, often on
the same machine: messages to people's e-mail addresses go through it
unguarded. docs/notifications.md says this to the people who use it.
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from urllib.parse import unquote, unquote_plus, urlsplit

from django.conf import settings

from pippa_site.errors import Invalid

# The Apprise schemes a person may use without the operator's say-so: channels
# that reach a person (a mailbox, a phone, a chat), not a machine.
PERSON_SCHEMES = frozenset(
    {
        "mailto",
        "mailtos",
        "ntfy",
        "ntfys",
        "tgram",
        "signal",
        "signals",
        "matrix",
        "matrixs",
        "pover",
        "discord",
        "slack",
        "gotify",
        "gotifys",
        "pbul",
        "mmost",
        "mmosts",
        "rocket",
        "rockets",
        "zulip",
    }
)
# Plugins that always send to their vendor's own host: the host in their URL
# is a token or an account, not a machine to resolve.
VENDOR_HOSTED = frozenset(
    {
        "NotifyTelegram",
        "NotifyPushover",
        "NotifyDiscord",
        "NotifySlack",
        "NotifyPushBullet",
        "NotifyZulip",
    }
)
# Arguments that would let a URL choose the method, the headers or the fields.
OVERRIDE_KEYS = frozenset({"method"})
OVERRIDE_PREFIXES = ("+", "-", ":")
# Cloud metadata services: refused even inside a network the operator allows.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean…
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS DNS
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS over IPv6
    )
)

ERR_SCHEME = (
    "“{address}” is a {service} address, which this site does not send to: use"
    " e-mail, ntfy, Telegram, Signal, Matrix, Pushover, Discord or Slack (the"
    " site's operator can allow more with PIPPA_NOTIFY_ALLOW_SCHEMES)"
)
ERR_OVERRIDE = (
    "“{address}” sets “{key}”, which would choose the method, headers or fields"
    " of the request: addresses here cannot"
)
ERR_HOST_MISSING = "“{address}” names no host to send to"
ERR_HOST_UNKNOWN = "cannot find the host “{host}” of “{address}”: check its spelling"
ERR_NOT_PUBLIC = (
    "“{address}” leads to {where} ({ip}), which this site does not send to: only"
    " public addresses (the site's operator can allow a network with"
    " PIPPA_NOTIFY_ALLOW_NETWORKS)"
)
ERR_CONNECT_REFUSED = "refused to connect to {where} ({ip})"


class AddressRefused(Invalid):
    """A notification address that may not be used (its words say why)."""

    code = "notify_address_refused"


class ConnectionRefused(ConnectionError):
    """A guarded send tried to connect where it may not."""


# -- the addresses ------------------------------------------------------------------


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in ipaddress.ip_network("64:ff9b::/96"):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _where(ip) -> str:
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "this machine (loopback)"
    if ip.is_unspecified:
        return "this machine (an unspecified address)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private:
        return "a private network"
    if ip.is_multicast:
        return "a multicast address"
    return "an address that is not public"


@cache
def _allowed_networks(spec: tuple[str, ...]):
    return tuple(ipaddress.ip_network(n.strip(), strict=False) for n in spec if n)


def address_refused(value: str) -> str | None:
    """Why connecting to IP address ``value`` is refused, in words; None if allowed."""
    try:
        ip = ipaddress.ip_address(value.split("%", 1)[0])
    except ValueError:
        return "an address that is not a number"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            return address_refused(str(inner))
    if ip in METADATA_ADDRESSES:
        return _where(ip)
    allowed = _allowed_networks(tuple(settings.PIPPA_NOTIFY_ALLOW_NETWORKS))
    if any(ip.version == net.version and ip in net for net in allowed):
        return None
    if not ip.is_global or ip.is_multicast:
        return _where(ip)
    return None


def resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to now (tests replace this with a stub)."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return sorted({info[4][0] for info in infos})


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def host_check(host: str, address: str) -> None:
    """Refuse ``host`` unless every address it resolves to is allowed."""
    if not host:
        raise AddressRefused(ERR_HOST_MISSING.format(address=address))
    host = host.strip("[]")
    if _is_ip(host):
        ips = [host]
    else:
        try:
            ips = resolve(host)
        except (OSError, UnicodeError):
            ips = []
        if not ips:
            raise AddressRefused(ERR_HOST_UNKNOWN.format(host=host, address=address))
    for ip in ips:
        where = address_refused(ip)
        if where is not None:
            raise AddressRefused(
                ERR_NOT_PUBLIC.format(address=address, where=where, ip=ip)
            )


def _schemes(plugin) -> set[str]:
    names: set[str] = set()
    for attr in ("protocol", "secure_protocol"):
        value = getattr(type(plugin), attr, None)
        if isinstance(value, str):
            names.add(value.lower())
        elif isinstance(value, list | tuple):
            names.update(str(v).lower() for v in value)
    return names


def allowed_schemes() -> frozenset[str]:
    extra = {s.strip().lower() for s in settings.PIPPA_NOTIFY_ALLOW_SCHEMES if s}
    return PERSON_SCHEMES | extra


def plugin_host(plugin) -> str | None:
    """The machine a plugin connects to as its URL names it; None for a vendor's own."""
    name = type(plugin).__name__
    if name in VENDOR_HOSTED:
        return None
    if name == "NotifyNtfy" and getattr(plugin, "mode", "") == "cloud":
        return None  # ntfy.sh itself
    if name == "NotifyMatrix" and getattr(plugin, "mode", "") == "t2bot":
        return None
    return getattr(plugin, "smtp_host", None) or getattr(plugin, "host", None) or ""


def url_check(url: str, plugin, *, address: str) -> None:
    """Refuse a person's Apprise URL that breaks a rule above (``AddressRefused``)."""
    schemes = _schemes(plugin)
    if not schemes & allowed_schemes():
        service = getattr(plugin, "service_name", "") or urlsplit(url).scheme
        raise AddressRefused(ERR_SCHEME.format(address=address, service=service))
    for part in urlsplit(url).query.split("&"):
        raw = part.split("=", 1)[0]
        # Apprise reads "+Name" before any decoding ("+" is not a space there).
        for key in {raw, unquote(raw), unquote_plus(raw).strip()}:
            if key.lower() in OVERRIDE_KEYS or key.startswith(OVERRIDE_PREFIXES):
                raise AddressRefused(ERR_OVERRIDE.format(address=address, key=raw))
    host = plugin_host(plugin)
    if host is not None:
        host_check(str(host), address)


# -- the connections a send opens ------------------------------------------------------

# While a guarded send runs: the list its refusals are told in (None: not guarded).
_guarded: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "pippa_notify_guarded", default=None
)
_hooked = False

# Socket events that name the address a socket is about to reach.
_EVENTS = ("socket.connect", "socket.sendto", "socket.sendmsg")


def _audit(event: str, args: tuple) -> None:
    if event not in _EVENTS:
        return
    refusals = _guarded.get()
    if refusals is None:
        return
    address = args[1] if len(args) > 1 else None
    if address is None and event != "socket.connect":
        return  # a send on a connected socket: its connect was checked
    if not isinstance(address, tuple) or not address:
        where, host = "a local socket", str(address)
    else:
        host = str(address[0])
        where = address_refused(host) if _is_ip(host) else "a name, not an address"
    if where is not None:
        refusal = ERR_CONNECT_REFUSED.format(where=where, ip=host)
        refusals.append(refusal)
        raise ConnectionRefused(refusal)


def _install() -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True


@contextmanager
def guarded(refusals: list[str] | None = None) -> Iterator[list[str]]:
    """Refuse, within this block (and the threads Apprise runs with a copy of
    its context), every connection to an address ``address_refused`` refuses,
    whatever name led there: checked on the address the socket really
    connects to, so a name that resolves elsewhere a moment later gains
    nothing. Each refusal is told, in words, in the list it yields."""
    _install()
    refusals = [] if refusals is None else refusals
    token = _guarded.set(refusals)
    try:
        yield refusals
    finally:
        _guarded.reset(token)
