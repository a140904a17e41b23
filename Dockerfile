# The postroom image: one command, `postroom`, for every role (init, relay, sender, recorder).
# Built by docker-compose.yml; see docs/docker.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# confluent-kafka and psycopg[binary] ship manylinux wheels: no compiler or libpq needed. The
# roles extra brings the roles' libraries (Kafka, Avro, SMTP, migrations, metrics); the otel extra
# lets a role export spans when OTEL_EXPORTER_OTLP_ENDPOINT is set (unset: unused); the web extra
# serves `postroom web`, the console.
WORKDIR /src
COPY . .
RUN pip install '.[roles,otel,web]'

# /attachments exists in the image so POSTROOM_ATTACHMENTS_ROOT is valid with or without a mount.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/postroom postroom \
    && mkdir /attachments && chown postroom:postroom /attachments
USER postroom
WORKDIR /home/postroom

ENTRYPOINT ["postroom"]
CMD ["--help"]
