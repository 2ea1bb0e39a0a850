"""Tell a step's owner that it waits for them: the outbox and its delivery.

A step that starts waiting for a person (``needs_review``, or ``failed`` with
no attempts left) is told to its owner through Apprise (e-mail, ntfy,
Telegram, Signal, Matrix and the rest), with a link to the decision card:

1. ``notify_step_waiting`` writes a ``Notice`` row in the transaction that
   makes the step wait, so the row exists exactly when the transition does.
   An owner who has notifications off gets no row. One pending row a step
   (a unique index), however often a crash makes the transition be written.
2. After the commit, the worker's ``notify_deliver`` claims an owner's due
   notices with a compare-and-set (a claim that runs out, so a worker killed
   while sending leaves them to the next one), checks that each step still
   waits (a decision already taken drops its notice), sends one message for
   all of them, and only then marks them sent.
3. The notices of one message share ``message_id`` (the first one's id). A
   message cut short by a kill or refused by the receiver is sent again with
   the same notices and the same id: an e-mail's Message-ID header, an HTTP
   receiver's ``X-Pippa-Message-Id``, so the repeat shows once. Delivery is
   at least once.
4. Coalescing: a first notice waits ``PIPPA_NOTIFY_DELAY_SECONDS`` for others
   to join it; after a message, the owner's next one waits until
   ``PIPPA_NOTIFY_WINDOW_SECONDS`` have passed. A receiver that fails is
   tried again after a back-off (``tasks.faults.backoff_delay``).

docs/notifications.md is the user's side of this.
"""

from __future__ import annotations

import contextvars
import logging
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import DatabaseError, connection, transaction
from django.db.models import Max, Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from notifications.models import Notice, NotifySettings
from notifications.safety import AddressRefused, guarded, url_check
from pippa_site import metrics
from pippa_site.errors import Invalid
from pippa_site.text import text_refused
from tasks import hooks
from tasks.actions import step_decision
from tasks.crashpoints import crashpoint
from tasks.faults import backoff_delay
from tasks.models import Conversation, Step, Task
from tasks.words import error_words

log = logging.getLogger("pippa.notify")

# The step statuses that wait for a person (the executor's and the doctor's
# transitions into them send ``tasks.hooks.step_waiting``, which
# ``notify_step_waiting`` receives).
WAITING = (Step.Status.NEEDS_REVIEW, Step.Status.FAILED)
MAIL_SCHEMES = ("mailto", "mailtos")
# Apprise plugins that send custom HTTP headers given as ``+Name=value``.
HEADER_SCHEMES = ("json", "jsons", "form", "forms", "xml", "xmls")
HEADER_MESSAGE_ID = "X-Pippa-Message-Id"
MAX_ADDRESSES = 5
MAX_ADDRESS_CHARS = 500
MAX_NOTICES_A_MESSAGE = 50

ERR_TOO_MANY = f"give at most {MAX_ADDRESSES} addresses, one a line"
ERR_TOO_LONG = f"an address is at most {MAX_ADDRESS_CHARS} characters long"
ERR_BAD_TEXT = "an address contains a character that cannot be stored (NUL)"
ERR_NO_ADDRESS = (
    "give at least one e-mail address or Apprise URL to turn notifications on"
)
ERR_BAD_EMAIL = "“{address}” is not an e-mail address"
ERR_NO_MAIL_SERVER = (
    "this site has no mail server set (a mailto:// or mailtos:// URL in "
    "PIPPA_NOTIFY_URLS), so it cannot send e-mail to “{address}”; give an "
    "Apprise URL instead (ntfy, Telegram, Signal, Matrix, …)"
)
ERR_MAIL_SERVER_BAD = (
    "this site's mail server URL (PIPPA_NOTIFY_URLS) is not one Apprise can use, "
    "so it cannot send e-mail now; ask whoever runs the site, or give an Apprise URL"
)
ERR_SITE_URL_BAD = (
    "PIPPA_NOTIFY_URLS entry {n} ({scheme}://…) is not one Apprise can use"
)
ERR_SITE_URL_UNUSED = (
    "PIPPA_NOTIFY_URLS entry {n} ({scheme}://…) is not a mail server and is not used:"
    " other channels are each person's own address on the Notifications page"
)
ERR_BAD_URL = (
    "Apprise does not know how to send to “{address}”: check the URL against "
    "the Apprise documentation (e.g. ntfys://ntfy.sh/my-topic)"
)

DROPPED_DECIDED = "the step no longer waits: the decision was taken first"
DROPPED_OFF = "the owner turned notifications off"
DROPPED_GONE = "the task was cancelled"


class NotifyError(Invalid):
    """Notification settings that cannot be used (the page shows why)."""

    code = "notify_settings_invalid"


# -- the transition: one outbox row, in the caller's transaction -----------------


def notify_step_waiting(
    *, step_id: int, reason: str, owner_id: int | None = None
) -> bool:
    """Write the notice for a step that starts waiting for a person.

    Call it inside the transaction that makes the step wait: the notice
    commits with the transition or not at all. Nothing is written for an
    owner whose notifications are off. Return whether a notice was written.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("notify_step_waiting runs inside the step's transaction")
    if owner_id is None:
        owner_id = (
            Conversation.objects.filter(tasks__steps__pk=step_id)
            .values_list("owner_id", flat=True)
            .first()
        )
    if owner_id is None or not _wants(owner_id):
        return False
    now = timezone.now()
    due = now + timedelta(seconds=settings.PIPPA_NOTIFY_DELAY_SECONDS)
    # The partial unique index keeps one pending notice a step.
    Notice.objects.bulk_create(
        [
            Notice(
                owner_id=owner_id,
                step_id=step_id,
                reason=str(reason)[:16],
                created_at=now,
                due_at=due,
            )
        ],
        ignore_conflicts=True,
    )
    return True


def _wants(owner_id: int) -> bool:
    return (
        NotifySettings.objects.filter(user_id=owner_id, enabled=True)
        .exclude(addresses="")
        .exists()
    )


def connect() -> None:
    """Receive the tasks app's signals (``tasks.hooks``): the outbox row in
    the transaction that makes a step wait, the site's problems at a worker's
    start, and delivery at each of its rounds."""
    hooks.step_waiting.connect(
        _on_step_waiting, dispatch_uid="notifications.outbox.step_waiting"
    )
    hooks.worker_started.connect(
        _on_worker_started, dispatch_uid="notifications.outbox.worker_started"
    )
    hooks.worker_round.connect(
        _on_worker_round, dispatch_uid="notifications.outbox.worker_round"
    )


def _on_step_waiting(sender, *, step_id: int, reason: str, owner_id=None, **kwargs):
    notify_step_waiting(step_id=step_id, reason=reason, owner_id=owner_id)


def _on_worker_started(sender, *, worker_id: str, **kwargs) -> list[str]:
    return notify_site_problems()


def _on_worker_round(sender, *, worker_id: str, **kwargs) -> None:
    notify_deliver(worker_id=worker_id)


# -- a person's settings ------------------------------------------------------------


def notify_settings_get(*, user) -> NotifySettings:
    """The user's notification settings (off, no address, until they are saved)."""
    found = NotifySettings.objects.filter(user=user).first()
    return found or NotifySettings(user=user)


@transaction.atomic
def notify_settings_save(*, user, enabled: bool, addresses: str) -> NotifySettings:
    """Check the addresses with Apprise and save the user's choice.

    Raise ``NotifyError`` naming the first address that cannot be used.
    """
    lines = [line.strip() for line in str(addresses).splitlines() if line.strip()]
    for line in lines:
        notify_address_check(line)
    if len(lines) > MAX_ADDRESSES:
        raise NotifyError(ERR_TOO_MANY)
    if enabled and not lines:
        raise NotifyError(ERR_NO_ADDRESS)
    row, _ = NotifySettings.objects.select_for_update().get_or_create(user=user)
    row.enabled = bool(enabled)
    row.addresses = "\n".join(lines)
    row.updated_at = timezone.now()
    row.save()
    return row


@dataclass(frozen=True)
class Target:
    """Where one of a person's addresses sends, as ``notify_address_check`` found it."""

    address: str  # as the person wrote it
    url: str  # the Apprise URL it is sent through
    # An e-mail: an HTML part and a text part, and a one-click unsubscribe.
    mail: bool
    # Through the site's own mail server (the operator's, often on this
    # machine): not held to the rules of a person's own URL.
    trusted: bool

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()


def notify_address_check(address: str) -> Target:
    """Return where an address is sent through; raise ``NotifyError`` saying why not.

    An e-mail address goes through the site's mail server. Anything else is
    a person's own Apprise URL, held to ``notifications.safety``'s rules: a
    channel meant for a person, no overrides, a public host (resolved now).
    """
    if len(address) > MAX_ADDRESS_CHARS:
        raise NotifyError(ERR_TOO_LONG)
    if text_refused(address):
        raise NotifyError(ERR_BAD_TEXT)
    shown = address[:80]
    if "://" not in address:
        try:
            validate_email(address)
        except ValidationError:
            raise NotifyError(ERR_BAD_EMAIL.format(address=shown)) from None
        server = mail_server_url()
        if not server:
            raise NotifyError(ERR_NO_MAIL_SERVER.format(address=shown))
        if _apprise().Apprise.instantiate(server) is None:
            raise NotifyError(ERR_MAIL_SERVER_BAD)
        url = _with_query(server, "to", address)
        if _apprise().Apprise.instantiate(url) is None:
            raise NotifyError(ERR_BAD_URL.format(address=shown))
        return Target(address=address, url=url, mail=True, trusted=True)
    plugin = _apprise().Apprise.instantiate(address)
    if plugin is None:
        raise NotifyError(ERR_BAD_URL.format(address=shown))
    try:
        url_check(address, plugin, address=shown)
    except AddressRefused as exc:
        raise NotifyError(str(exc)) from None
    return Target(
        address=address,
        url=address,
        mail=type(plugin).__name__ == "NotifyEmail",
        trusted=False,
    )


def mail_server_url() -> str:
    """The site's mail server: the first mailto(s):// URL in PIPPA_NOTIFY_URLS."""
    for url in settings.PIPPA_NOTIFY_URLS:
        if urlsplit(url).scheme.lower() in MAIL_SCHEMES:
            return url
    return ""


def notify_site_problems() -> list[str]:
    """What is wrong with PIPPA_NOTIFY_URLS, in words (no secrets); the worker logs it."""
    problems = []
    for n, url in enumerate(settings.PIPPA_NOTIFY_URLS, start=1):
        scheme = urlsplit(url).scheme.lower() or "?"
        if scheme not in MAIL_SCHEMES:
            problems.append(ERR_SITE_URL_UNUSED.format(n=n, scheme=scheme))
        elif _apprise().Apprise.instantiate(url) is None:
            problems.append(ERR_SITE_URL_BAD.format(n=n, scheme=scheme))
    return problems


def _with_query(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` replacing any such argument (others untouched)."""
    base, _, query = url.partition("?")
    kept = [
        part
        for part in query.split("&")
        if part and part.split("=", 1)[0].lower() != name.lower()
    ]
    kept.append(f"{name}={quote(value, safe='@')}")
    return f"{base}?{'&'.join(kept)}"


def _apprise():
    import apprise  # loaded by the worker and the settings page only

    return apprise


# -- delivery (the worker, after the commit) -------------------------------------------


@dataclass
class DeliveryReport:
    messages: int = 0  # messages sent
    notices: int = 0  # notices in them
    dropped: int = 0
    failed: int = 0  # messages that will be tried again
    errors: list[str] = field(default_factory=list)


def notify_deliver(*, worker_id: str, limit: int = 20) -> DeliveryReport:
    """Send every owner's due notices, one message an owner; return what happened.

    1. Find owners with a due notice that no live claim holds.
    2. For each, claim the message's notices (``_claim``): the notices of a
       message tried before, as they were, or else all the owner's pending
       notices once the owner's window is open.
    3. Drop the notices whose step no longer waits; send the rest in one
       message through Apprise, then mark them sent. A failure frees them
       with a back-off; a kill leaves the claim to run out.
    """
    report = DeliveryReport()
    now = timezone.now()
    owners = list(
        Notice.objects.filter(state=Notice.State.PENDING, due_at__lte=now)
        .filter(_unclaimed(now))
        .order_by()
        .values_list("owner_id", flat=True)
        .distinct()[:limit]
    )
    for owner_id in owners:
        ids = _claim(owner_id, worker_id)
        if not ids:
            continue
        try:
            _send_claimed(owner_id, ids, worker_id, report)
        except DatabaseError:
            raise  # the worker's fault state: back off, reconnect
        except Exception:  # noqa: BLE001 - a sender's bug must not stop the worker
            # The claim runs out and the message is tried again, same id.
            log.exception("%s: message to user %s not sent", worker_id, owner_id)
            report.failed += 1
    # Counted once each message's state is written (sent, or back-off).
    metrics.notifications_observed(sent=report.messages, failed=report.failed)
    return report


def _unclaimed(now) -> Q:
    return Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)


def _claim(owner_id: int, worker_id: str) -> list[int]:
    """Claim the notices of the owner's next message (compare-and-set); [] if none."""
    with transaction.atomic():
        now = timezone.now()
        free = Notice.objects.filter(
            owner_id=owner_id, state=Notice.State.PENDING
        ).filter(_unclaimed(now))
        rows = list(free.order_by("id").values_list("id", "message_id", "due_at"))
        if not rows:
            return []
        begun = [message for _, message, _ in rows if message is not None]
        if begun:
            # A message tried before goes again as it was: same notices, same id.
            message_id = min(begun)
            batch = [(pk, due) for pk, message, due in rows if message == message_id]
            if min(due for _, due in batch) > now:
                return []
        else:
            if not any(due <= now for _, _, due in rows):
                return []
            last = Notice.objects.filter(
                owner_id=owner_id, state=Notice.State.SENT
            ).aggregate(last=Max("sent_at"))["last"]
            window = timedelta(seconds=settings.PIPPA_NOTIFY_WINDOW_SECONDS)
            if last is not None and last + window > now:
                free.filter(due_at__lt=last + window).update(due_at=last + window)
                return []
            batch = [(pk, due) for pk, _, due in rows[:MAX_NOTICES_A_MESSAGE]]
            message_id = batch[0][0]
        ids = [pk for pk, _ in batch]
        until = now + timedelta(seconds=settings.PIPPA_NOTIFY_CLAIM_SECONDS)
        taken = (
            Notice.objects.filter(pk__in=ids, state=Notice.State.PENDING)
            .filter(_unclaimed(now))
            .update(claimed_by=worker_id, claimed_until=until, message_id=message_id)
        )
        if taken != len(ids):  # another worker claimed some of them first
            transaction.set_rollback(True)
            return []
        return ids


@dataclass
class _Item:
    """One decision in a message: which step, and why it waits, in Dad's words."""

    notice_id: int
    task_id: int
    task_title: str
    position: int
    step_title: str
    reason: str  # the step's waiting status
    attempts: int
    why: str  # in Dad's words, never an exception's name

    @property
    def link(self) -> str:
        """The decision card: a short address that survives a login on the way
        (``dashboard:task_decide`` answers with the card's ``#attention-N``)."""
        path = reverse("dashboard:task_decide", args=[self.task_id, self.position])
        return f"{settings.PIPPA_SITE_URL}{path}"

    @property
    def what(self) -> str:
        if self.reason == Step.Status.NEEDS_REVIEW:
            return "was set aside for you"
        if self.attempts > 1:
            return f"failed after {self.attempts} attempts"
        return "failed"

    @property
    def task_line(self) -> str:
        return _line(self.task_title)

    @property
    def step_line(self) -> str:
        return _line(self.step_title)


def _why(step: Step, task: Task) -> str:
    """Why ``step`` waits, in Dad's words: what went wrong and what Pippa would
    do (the decision card's own sentences); the exception stays on the page's
    engineer's fold."""
    if step.status == Step.Status.FAILED:
        return _line(error_words(step.error), 300)
    decision = step_decision(step=step, task=task)
    return _line(decision.plain_words, 300) if decision is not None else ""


def _send_claimed(owner_id: int, ids: list[int], worker_id: str, report) -> None:
    notices = list(
        Notice.objects.filter(pk__in=ids, claimed_by=worker_id)
        .select_related("step__task")
        .order_by("id")
    )
    if not notices:
        return
    message_id = notices[0].message_id
    prefs = NotifySettings.objects.filter(user_id=owner_id).first()
    live: list[_Item] = []
    drops: dict[str, list[int]] = {}
    for notice in notices:
        step, task = notice.step, notice.step.task
        if prefs is None or not prefs.enabled or not prefs.address_list:
            drops.setdefault(DROPPED_OFF, []).append(notice.pk)
        elif task.status == Task.Status.CANCELLED:
            drops.setdefault(DROPPED_GONE, []).append(notice.pk)
        elif step.status not in WAITING or step.stopped:
            drops.setdefault(DROPPED_DECIDED, []).append(notice.pk)
        else:
            live.append(
                _Item(
                    notice_id=notice.pk,
                    task_id=task.pk,
                    task_title=task.title,
                    position=step.position,
                    step_title=step.title,
                    reason=step.status,
                    attempts=step.attempts,
                    why=_why(step, task),
                )
            )
    for note, dropped in drops.items():
        Notice.objects.filter(pk__in=dropped, state=Notice.State.PENDING).update(
            state=Notice.State.DROPPED, note=note, claimed_by="", claimed_until=None
        )
        report.dropped += len(dropped)
    if not live:
        return
    message = message_compose(live, owner_id=owner_id)
    error = _send(prefs.address_list, message, message_id=message_id)
    crashpoint("after_notify_sent")
    live_ids = [item.notice_id for item in live]
    if error is None:
        Notice.objects.filter(pk__in=live_ids, state=Notice.State.PENDING).update(
            state=Notice.State.SENT,
            sent_at=timezone.now(),
            claimed_by="",
            claimed_until=None,
            note="",
        )
        report.messages += 1
        report.notices += len(live_ids)
        return
    attempts = max(n.attempts for n in notices) + 1
    delay = backoff_delay(
        attempts,
        base=settings.PIPPA_NOTIFY_RETRY_BASE_SECONDS,
        cap=settings.PIPPA_NOTIFY_RETRY_MAX_SECONDS,
    )
    Notice.objects.filter(pk__in=live_ids, state=Notice.State.PENDING).update(
        attempts=attempts,
        due_at=timezone.now() + timedelta(seconds=delay),
        claimed_by="",
        claimed_until=None,
        note=error[:300],
    )
    report.failed += 1
    report.errors.append(error)
    log.warning(
        "%s: message %s to user %s not sent (%s); trying again in %.0f s",
        worker_id,
        message_id,
        owner_id,
        error,
        delay,
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _line(text: str, limit: int = 200) -> str:
    """One line of a person's text: no line breaks (a mail header stays one)."""
    return _CONTROL.sub(" ", text)[:limit].strip()


@dataclass(frozen=True)
class Message:
    """One message, as every channel gets it: a title, a text with line
    breaks, and for e-mail an HTML part (one paragraph a decision, a
    button-like link to each card) and the one-click "Turn these off"."""

    title: str
    text: str
    html: str
    unsubscribe: str = ""


def message_compose(items: list[_Item], *, owner_id: int) -> Message:
    """The message about ``items`` for their owner (templates
    ``notifications/message.txt`` and ``message.html``)."""
    if len(items) == 1:
        item = items[0]
        title = f"Pippa: step {item.position} of “{item.task_line}” waits for you"
    else:
        title = f"Pippa: {len(items)} decisions wait for you"
    context = {
        "items": items,
        "title": title,
        "unsubscribe": notify_unsubscribe_url(owner_id),
        "settings_url": f"{settings.PIPPA_SITE_URL}{reverse('notify_settings')}",
    }
    return Message(
        title=title,
        text=render_to_string("notifications/message.txt", context).strip() + "\n",
        html=render_to_string("notifications/message.html", context),
        unsubscribe=context["unsubscribe"],
    )


# -- turning messages off from the message itself ----------------------------------

UNSUBSCRIBE_SALT = "pippa.notifications.unsubscribe"


def notify_unsubscribe_token(user_id: int) -> str:
    """A signed token that turns off one person's messages: it names them, so
    it works without a login and for nobody else."""
    return signing.dumps({"u": int(user_id)}, salt=UNSUBSCRIBE_SALT, compress=True)


def notify_unsubscribe_url(user_id: int) -> str:
    path = reverse("notify_off", args=[notify_unsubscribe_token(user_id)])
    return f"{settings.PIPPA_SITE_URL}{path}"


def notify_unsubscribe_user(token: str) -> int | None:
    """The user a token names, or None for a token this site did not sign."""
    try:
        data = signing.loads(token, salt=UNSUBSCRIBE_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("u"), int):
        return None
    return data["u"]


@transaction.atomic
def notify_turn_off(*, user_id: int) -> bool:
    """Turn a person's messages off (their addresses stay, for turning them on
    again); what waited to be sent is dropped when its turn comes. Return
    whether they were on."""
    return bool(
        NotifySettings.objects.filter(user_id=user_id, enabled=True).update(
            enabled=False, updated_at=timezone.now()
        )
    )


# -- a test message --------------------------------------------------------------------

ERR_TEST_TOO_SOON = "a test message went out {ago} s ago: wait {wait} s before the next"
ERR_TEST_NOTHING = "give an address to send a test message to"


def notify_test_send(*, user, addresses: str) -> str | None:
    """Send a test message to ``addresses`` (checked like a save, not saved).

    Return None when every address took it, else why not, in words. At most
    one test a person every ``PIPPA_NOTIFY_TEST_SECONDS`` (the button must not
    be a way to flood someone's inbox). Raise ``NotifyError`` for an address
    that cannot be used.
    """
    lines = [line.strip() for line in str(addresses).splitlines() if line.strip()]
    if not lines:
        raise NotifyError(ERR_TEST_NOTHING)
    if len(lines) > MAX_ADDRESSES:
        raise NotifyError(ERR_TOO_MANY)
    for line in lines:
        notify_address_check(line)
    now = timezone.now()
    with transaction.atomic():
        row, _ = NotifySettings.objects.select_for_update().get_or_create(user=user)
        since = (now - row.test_sent_at).total_seconds() if row.test_sent_at else None
        limit = settings.PIPPA_NOTIFY_TEST_SECONDS
        if since is not None and 0 <= since < limit:
            raise NotifyError(
                ERR_TEST_TOO_SOON.format(ago=int(since), wait=int(limit - since) + 1)
            )
        NotifySettings.objects.filter(pk=row.pk).update(test_sent_at=now)
    context = {
        "settings_url": f"{settings.PIPPA_SITE_URL}{reverse('notify_settings')}",
        "unsubscribe": notify_unsubscribe_url(user.pk),
        "test": True,
    }
    message = Message(
        title="Pippa: a test message",
        text=render_to_string("notifications/message.txt", context).strip() + "\n",
        html=render_to_string("notifications/message.html", context),
        unsubscribe=context["unsubscribe"],
    )
    return _send(lines, message, message_id=None)


# -- Apprise ------------------------------------------------------------------------

# What the e-mail plugin sends while a message of ours goes out: its
# Message-ID (Apprise writes its own with ``make_msgid`` after any custom
# header, so a header of ours would make two) and the text part (Apprise makes
# one from the HTML part, and drops its links). ``_patch_email`` has the
# plugin ask these first.
_message_id: contextvars.ContextVar[str] = contextvars.ContextVar(
    "pippa_notify_message_id", default=""
)
_text_part: contextvars.ContextVar[str] = contextvars.ContextVar(
    "pippa_notify_text_part", default=""
)
_patched = False


def _patch_email() -> None:
    global _patched
    if _patched:
        return
    from apprise.plugins.email import base as email_base

    make_msgid = email_base.make_msgid
    convert_between = email_base.convert_between

    def _msgid(*args, **kwargs) -> str:
        return _message_id.get() or make_msgid(*args, **kwargs)

    def _convert(source, target, content, *args, **kwargs):
        text = _text_part.get()
        if text and target == "text":
            return text
        return convert_between(source, target, content, *args, **kwargs)

    email_base.make_msgid = _msgid
    email_base.convert_between = _convert
    _patched = True


def message_id_header(message_id: int) -> str:
    """The e-mail Message-ID of an outbox message: the same on every try."""
    host = urlsplit(settings.PIPPA_SITE_URL).hostname or "localhost"
    host = re.sub(r"[^A-Za-z0-9.-]", "", host) or "localhost"
    return f"<pippa-notice-{message_id}@{host}>"


def _send(
    addresses: list[str], message: Message, *, message_id: int | None
) -> str | None:
    """Send ``message`` to every address; None when all took it, else why not.

    Each address is checked again first (its host resolved again), and a
    person's own URL is sent inside ``notifications.safety.guarded``, which
    refuses any connection to an address that is not public, whatever its
    name resolved to a moment before. Every address is tried; one failure
    makes the whole message be tried again later, under the same id.
    """
    try:
        _patch_email()
    except (ImportError, AttributeError):  # another Apprise: its own Message-ID
        log.warning("this Apprise's e-mail plugin cannot take our Message-ID")
    header = message_id_header(message_id) if message_id is not None else ""
    errors = []
    for address in addresses:
        try:
            target = notify_address_check(address)
        except NotifyError as exc:
            errors.append(str(exc))
            continue
        error = _send_one(target, message, header)
        if error is not None:
            errors.append(error)
    if not errors:
        return None
    if len(addresses) > 1:
        return f"{len(errors)} of {len(addresses)} addresses failed: {errors[0]}"[:300]
    return errors[0][:300]


def _send_one(target: Target, message: Message, header: str) -> str | None:
    apprise = _apprise()
    asset = apprise.AppriseAsset(async_mode=False)
    plugin = apprise.Apprise.instantiate(target.url, asset=asset)
    if plugin is None:
        return ERR_BAD_URL.format(address=target.address[:80])
    headers = getattr(plugin, "headers", None)
    if isinstance(headers, dict):
        if header and target.scheme in HEADER_SCHEMES:
            headers[HEADER_MESSAGE_ID] = header
        if target.mail and message.unsubscribe:
            # RFC 2369 and RFC 8058: the mail client's own "Unsubscribe", one click.
            headers["List-Unsubscribe"] = f"<{message.unsubscribe}>"
            headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    sender = apprise.Apprise(asset=asset)
    sender.add(plugin)
    if target.mail:
        body, body_format = message.html, apprise.NotifyFormat.HTML
    else:
        body, body_format = message.text, apprise.NotifyFormat.TEXT
    tokens = [(_message_id, _message_id.set(header if target.mail else ""))]
    tokens.append((_text_part, _text_part.set(message.text if target.mail else "")))
    refused: list[str] = []
    try:
        with nullcontext() if target.trusted else guarded(refused):
            result = sender.notify(
                title=message.title, body=body, body_format=body_format
            )
    except Exception as exc:  # noqa: BLE001 - a plugin's crash is a failed send
        return refused[0] if refused else f"{type(exc).__name__}: {exc}"[:300]
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
    if result:
        return None
    if refused:
        return f"“{target.address[:80]}”: {refused[0]}"
    return f"“{target.address[:80]}” refused the message"
