"""Report jobs import postroom's API from the postroom package; the roles stay internal, and the
import is light: no database, Kafka, SMTP, HTTP or Avro library comes with it."""

from __future__ import annotations

import subprocess
import sys

from postroom.relay import batch, outbox


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=False, timeout=60)


def test_enqueue_is_the_outbox_function() -> None:
    import postroom

    assert postroom.enqueue is outbox.enqueue


def test_importing_the_base_does_not_load_the_roles() -> None:
    proc = run("import sys, postroom.settings; print(sorted(m for m in ('postroom.relay', "
               "'postroom.sender') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_unknown_attributes_are_still_attribute_errors() -> None:
    import postroom

    assert not hasattr(postroom, "send_now")


def test_enqueue_many_and_email_are_the_outbox_ones() -> None:
    import postroom

    assert postroom.enqueue_many is batch.enqueue_many
    assert postroom.Email is outbox.Email
    assert postroom.Batch is batch.Batch
    assert {"enqueue", "enqueue_many", "Email", "Batch"} <= set(postroom.__all__)


# Libraries a job's import must not load: the roles' clients, and the database libraries too
# (the job's own connection brings its library; the adapter for it loads at the first call).
FORBIDDEN = ("confluent_kafka", "fastavro", "aiosmtplib", "aiosmtpd", "httpx", "requests",
             "prometheus_client", "alembic", "flufl", "uvloop", "opentelemetry", "sqlalchemy",
             "psycopg", "psycopg_binary", "django", "asyncio", "smtplib")
PUBLIC_IMPORT = ("from postroom import enqueue, Batch, enqueue_many, Email, EnqueueError, "
                 "InvalidEmailError, InvalidAttachmentError, InvalidConnectionError, "
                 "SchemaNotReadyError")


def test_the_public_import_loads_postroom_and_the_standard_library_only() -> None:
    proc = run(f"import sys; {PUBLIC_IMPORT}\n"
               "print(sorted({m.partition('.')[0] for m in sys.modules} "
               "- set(sys.stdlib_module_names)))")
    assert proc.returncode == 0, proc.stderr
    loaded = set(eval(proc.stdout))  # noqa: S307 (our own subprocess's repr of a list)
    assert loaded & set(FORBIDDEN) == set()
    # postroom, and what a venv's site or an editable install put there before it
    assert {name for name in loaded if not name.startswith(("_", "__editable__"))} == {"postroom"}


def test_the_public_import_loads_no_role() -> None:
    proc = run(f"import sys; {PUBLIC_IMPORT}\n"
               "print(sorted(m for m in sys.modules if m.startswith('postroom.') and "
               "m.split('.')[1] in ('sender', 'bounces', 'kafka', 'metrics', 'cli', 'lag') "
               "or m in ('postroom.schemas.codec', 'postroom.relay.publisher', "
               "'postroom.relay.inserts', 'postroom.relay.pgdriver')))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_error_types_are_the_relay_s() -> None:
    import postroom
    from postroom.relay import errors

    for name in ("EnqueueError", "InvalidEmailError", "InvalidAttachmentError",
                 "InvalidConnectionError", "SchemaNotReadyError"):
        assert getattr(postroom, name) is getattr(errors, name), name
