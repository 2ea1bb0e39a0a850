"""A person's notification addresses are safe by default (server-side request forgery).

The addresses the security audit saved (a cloud metadata URL with the method
and a header of its choosing, a form POST turned DELETE at loopback, syslog)
are each refused when saved; so is every other way to reach this machine, a
private network, a link-local or a metadata address. Nothing here opens a
connection: hosts resolve through the tests' ``StubResolver``, metadata,
private and public addresses are only strings, and ``no_connections`` proves
that no socket was asked to connect while an address was checked. The sends
that are refused at send time (``test_safety_send``) use loopback receivers.
"""

from __future__ import annotations

import sys
import threading

import pytest
from django.urls import reverse

from notifications.models import NotifySettings
from notifications.outbox import NotifyError, notify_address_check, notify_settings_save
from notifications.safety import address_refused

_watch = threading.local()


def _count_connects(event: str, args: tuple) -> None:
    if event in ("socket.connect", "socket.sendto") and getattr(_watch, "on", False):
        _watch.seen.append(args[1] if len(args) > 1 else None)


sys.addaudithook(_count_connects)


@pytest.fixture
def no_connections():
    """Fail if this thread asks a socket to connect anywhere during the test."""
    _watch.on, _watch.seen = True, []
    yield _watch.seen
    _watch.on = False
    assert _watch.seen == [], f"a connection was opened: {_watch.seen}"


# -- the audit's addresses, each refused when saved --------------------------------

AUDIT = [
    (
        "json://169.254.169.254/computeMetadata/v1/?method=GET&+Metadata-Flavor=Google",
        "which this site does not send to",
    ),
    (
        "form://127.0.0.1:8080/admin/users/1?method=DELETE",
        "which this site does not send to",
    ),
    ("syslog://", "which this site does not send to"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("address", "words"), AUDIT)
def test_the_audits_addresses_are_refused_when_saved(
    address, words, make_user, client, no_connections
):
    client.force_login(make_user(username="dad"))
    page = client.post(
        reverse("notify_settings"), {"enabled": "on", "addresses": address}
    )
    assert page.status_code == 400
    assert words in page.content.decode()
    assert not NotifySettings.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("address", "words"),
    [
        # The operator allowed webhooks: the metadata address is still refused,
        # and so are the method and the header the URL chose.
        (
            "json://169.254.169.254/computeMetadata/v1/",
            "a cloud metadata address (169.254.169.254)",
        ),
        (
            "json://metadata.example.net/computeMetadata/v1/",
            "a cloud metadata address (169.254.169.254)",
        ),
        ("json://hook.example.net/x?method=GET", "sets “method”"),
        (
            "json://hook.example.net/x?+Metadata-Flavor=Google",
            "sets “+Metadata-Flavor”",
        ),
        ("json://hook.example.net/x?-User-Agent", "sets “-User-Agent”"),
        ("json://hook.example.net/x?:field=value", "sets “:field”"),
        ("form://127.0.0.1:8080/admin/users/1", "this machine (loopback) (127.0.0.1)"),
        ("form://127.0.0.1:8080/admin/users/1?method=DELETE", "sets “method”"),
        ("syslog://", "names no host"),
    ],
)
def test_allowing_a_scheme_still_refuses_loopback_metadata_and_overrides(
    address, words, make_user, settings, resolver, no_connections
):
    settings.PIPPA_NOTIFY_ALLOW_SCHEMES = ["json", "form", "syslog"]
    resolver.names["metadata.example.net"] = ["169.254.169.254"]
    resolver.names["hook.example.net"] = ["93.184.215.14"]
    with pytest.raises(NotifyError) as refused:
        notify_settings_save(
            user=make_user(username="dad"), enabled=True, addresses=address
        )
    assert words in str(refused.value)
    assert not NotifySettings.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("address", "where"),
    [
        ("ntfy://127.0.0.1/topic", "this machine (loopback)"),
        ("ntfys://127.1.2.3/topic", "this machine (loopback)"),
        ("ntfys://[::1]/topic", "this machine (loopback)"),
        ("ntfys://[::ffff:127.0.0.1]/topic", "this machine (loopback)"),
        ("ntfys://[::ffff:169.254.169.254]/topic", "a cloud metadata address"),
        ("ntfys://0.0.0.0/topic", "this machine (an unspecified address)"),
        ("ntfys://10.1.2.3/topic", "a private network"),
        ("ntfys://172.16.0.9/topic", "a private network"),
        ("ntfys://192.168.1.20/topic", "a private network"),
        ("ntfys://[fd00::1]/topic", "a private network"),
        ("ntfys://169.254.1.1/topic", "a link-local address"),
        ("ntfys://[fe80::1]/topic", "a link-local address"),
        ("gotify://100.100.100.200/token", "a cloud metadata address"),
        ("gotify://100.64.0.1/token", "an address that is not public"),
        ("signal://[fd00:ec2::254]/+12025550123", "a cloud metadata address"),
        ("mailtos://me:secret@192.168.1.1?to=dad@example.org", "a private network"),
        ("ntfys://localhost/topic", "this machine (loopback)"),
        ("ntfys://nas.home.arpa/topic", "a private network"),
        ("ntfys://two-faced.example.net/topic", "this machine (loopback)"),
        ("matrixs://me:secret@[2002:7f00:1::]/#room", "this machine (loopback)"),
    ],
)
def test_a_persons_address_may_not_reach_this_machine_a_private_network_or_metadata(
    address, where, resolver, no_connections
):
    resolver.names["nas.home.arpa"] = ["192.168.1.20"]
    # One public address and one private: the private one decides.
    resolver.names["two-faced.example.net"] = ["93.184.215.14", "127.0.0.1"]
    with pytest.raises(NotifyError) as refused:
        notify_address_check(address)
    assert where in str(refused.value)


@pytest.mark.parametrize(
    "address",
    [
        "ntfys://ntfy.sh/pippa-dad",
        "ntfy://pippa-dad",  # ntfy.sh itself
        "tgram://123456789:AAbbCCddEEffGG/12345",
        "https://discord.com/api/webhooks/123456/abcdefABCDEF",
        "pover://userkeyuserkeyuserkeyuserkey@tokentokentokentokentokentoken",
        "matrixs://me:secret@matrix.example.org/#family",
        "mailtos://me:secret@smtp.example.org?to=dad@example.org",
    ],
)
def test_channels_meant_for_a_person_at_public_hosts_are_accepted(
    address, no_connections
):
    target = notify_address_check(address)
    assert not target.trusted


def test_a_name_that_does_not_resolve_is_refused_in_words(no_connections):
    with pytest.raises(NotifyError, match="cannot find the host “nowhere.invalid”"):
        notify_address_check("ntfys://nowhere.invalid/topic")


def test_the_operator_may_allow_a_network_but_never_a_metadata_address(
    settings, resolver, no_connections
):
    resolver.names["nas.home.arpa"] = ["192.168.1.20"]
    settings.PIPPA_NOTIFY_ALLOW_NETWORKS = ["192.168.1.0/24", "169.254.0.0/16"]

    assert notify_address_check("ntfys://nas.home.arpa/topic").url
    assert notify_address_check("ntfy://169.254.1.1/topic").url
    with pytest.raises(NotifyError, match="cloud metadata"):
        notify_address_check("ntfy://169.254.169.254/topic")
    with pytest.raises(NotifyError, match="a private network"):
        notify_address_check("ntfys://10.0.0.1/topic")


def test_an_email_address_goes_through_the_operators_own_mail_server(settings):
    # The site's mail server is the operator's (often on this machine).
    settings.PIPPA_NOTIFY_URLS = ["mailto://127.0.0.1:25?from=pippa@example.org"]
    target = notify_address_check("dad@example.org")
    assert (target.mail, target.trusted) == (True, True)
    assert "to=dad@example.org" in target.url


@pytest.mark.parametrize(
    ("ip", "refused"),
    [
        ("93.184.215.14", False),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", False),
        ("127.0.0.1", True),
        ("10.0.0.1", True),
        ("169.254.169.254", True),
        ("224.0.0.1", True),
        ("255.255.255.255", True),
        ("::", True),
        ("64:ff9b::7f00:1", True),  # NAT64 of 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", True),  # Teredo of 127.0.0.1
        ("fe80::1%eth0", True),
    ],
)
def test_address_refused_knows_the_special_ranges(ip, refused):
    assert (address_refused(ip) is not None) == refused
