"""Runs inside the django-post-office venv the benchmark makes: queue with ``mail.send``, then send
with what ``send_queued_mail`` runs, and print the send phase's figures as one JSON line.

``python postoffice_harness.py PLAN.json``; PLAN holds db, host, port, threads, batch, sender,
subject, body, recipients. Imports only Django, django-post-office and the standard library.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": plan["db"]}},
        INSTALLED_APPS=["django.contrib.contenttypes", "post_office"],
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST=plan["host"], EMAIL_PORT=plan["port"], EMAIL_USE_TLS=False,
        EMAIL_TIMEOUT=30, USE_TZ=True, DEFAULT_FROM_EMAIL=plan["sender"],
        POST_OFFICE={"THREADS_PER_PROCESS": plan["threads"], "BATCH_SIZE": plan["batch"],
                     "LOG_LEVEL": 0},
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates"}],
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from post_office import mail
    from post_office.models import STATUS, Email

    queue_started = time.perf_counter()
    for recipient in plan["recipients"]:
        mail.send(recipient, plan["sender"], subject=plan["subject"], message=plan["body"])
    queue_s = time.perf_counter() - queue_started
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    mail.send_queued_mail_until_done(lockfile=str(Path(plan["db"]).with_suffix(".lock")),
                                     processes=1)
    send_s = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "queue_s": queue_s, "send_s": send_s,
        "cpu_s": (cpu_after.ru_utime - cpu_before.ru_utime)
        + (cpu_after.ru_stime - cpu_before.ru_stime),
        "sent": Email.objects.filter(status=STATUS.sent).count(),
        "failed": Email.objects.filter(status=STATUS.failed).count(),
        "queued": Email.objects.filter(status=STATUS.queued).count(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
