"""``pippa_doctor``: report (and with --repair, fix) orphans, unowned artifacts,
stray or damaged blobs, expired leases and long-open tool-call envelopes.

The checks and repairs live in ``tasks.doctor``; this command is only the loop.
Exit code 0 means no problem remains, 1 that some do.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from tasks.doctor import DEFAULT_GRACE_SECONDS, doctor_run


class Command(BaseCommand):
    help = (
        "Find orphan rows, unowned artifacts, stray or damaged blobs, expired "
        "leases and long-open tool calls; --repair fixes what can be fixed."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--repair", action="store_true", help="fix what can be fixed"
        )
        parser.add_argument(
            "--json", action="store_true", help="print the report as JSON on stdout"
        )
        parser.add_argument(
            "--grace-seconds",
            type=int,
            default=None,
            help=(
                "leave blob files, temp files and artifacts younger than this "
                f"alone: a write may be in flight (default {DEFAULT_GRACE_SECONDS})"
            ),
        )
        parser.add_argument(
            "--no-verify",
            action="store_true",
            help="check blob presence and size only, without hashing every blob",
        )

    def handle(self, *args, **options):
        verbosity = options["verbosity"]

        def progress(message: str) -> None:
            if verbosity >= 1:
                self.stderr.write(f"doctor: {message}")

        report = doctor_run(
            repair=options["repair"],
            grace_seconds=options["grace_seconds"],
            verify=not options["no_verify"],
            progress=progress,
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        elif verbosity >= 1:
            self.stdout.write(f"blobs: {report.store}")
            for f in report.findings:
                if not (f.found or f.remaining):
                    continue
                line = f"{f.label}: {f.found:,} found"
                if report.repair:
                    line += f", {f.repaired:,} repaired, {f.remaining:,} remain"
                if f.remaining and f.advice:
                    line += f" ({f.advice})"
                self.stdout.write(line)
            if report.clean:
                self.stdout.write(self.style.SUCCESS("clean: no problems remain"))
        if not report.clean:
            raise CommandError(
                f"{report.problems:,} problem(s) remain"
                + ("" if report.repair else "; run with --repair to fix them"),
                returncode=1,
            )
