"""Make a fresh install usable: an operator account, and the demo when present.

Run by ``make run`` every time; a second run changes nothing.
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, call_command, get_commands

OPERATOR = "operator"


class Command(BaseCommand):
    help = "Create the operator account when none exists and load the demo data."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        if not User.objects.filter(is_superuser=True).exists():
            password = os.environ.get("PIPPA_ADMIN_PASSWORD") or secrets.token_urlsafe(
                12
            )
            User.objects.create_superuser(
                username=OPERATOR, email="", password=password
            )
            self.stdout.write(self.style.SUCCESS("Created the operator account."))
            self.stdout.write(f"  username: {OPERATOR}")
            if os.environ.get("PIPPA_ADMIN_PASSWORD"):
                self.stdout.write("  password: (from PIPPA_ADMIN_PASSWORD)")
            else:
                self.stdout.write(f"  password: {password}")
                self.stdout.write("  (shown once; change it in the admin)")
        if "pippa_demo" in get_commands():
            call_command("pippa_demo", verbosity=options["verbosity"])
