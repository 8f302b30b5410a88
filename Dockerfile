# syntax=docker/dockerfile:1
# The hermeneut image: one image, every stage (`topics`, `simulate`, `process`, `sink`, `trend`) is a
# subcommand. docker-compose.yml runs it next to Kafka and InfluxDB; settings come from HERMENEUT_* env vars.
#
#   docker build -t hermeneut .
#   docker run --rm hermeneut --help
#
# Every dependency (confluent-kafka, numpy, scikit-learn, faust-streaming, ...) has manylinux wheels for
# CPython 3.11 on x86_64, so no compiler or -dev package is installed. (On arm64 faust-streaming has no wheel;
# its sdist then installs without its optional C speedups.) The build stage builds the project's wheel (the one
# tests/integration/test_packaging.py builds the same way and installs in a clean venv), installs it into a venv
# that is copied alone into the runtime stage, so pip's cache, the build env and the source tree stay out of it.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_PREFER_BINARY=1
RUN python -m venv /opt/hermeneut
WORKDIR /src
COPY . .
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
    && /opt/hermeneut/bin/pip install /dist/hermeneut-*.whl \
    && /opt/hermeneut/bin/hermeneut --help >/dev/null

FROM ${PYTHON_IMAGE}
ARG UID=10001
ENV PATH=/opt/hermeneut/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A fixed, unprivileged uid; its home holds ~/.cache and ~/.local/state (settings.services.*), and the
# working directory is where the faust worker keeps its data directory (<group_prefix>-processor-data).
RUN useradd --uid "${UID}" --user-group --create-home --home-dir /home/hermeneut --shell /usr/sbin/nologin hermeneut \
    && install -d -o hermeneut -g hermeneut /var/lib/hermeneut /home/hermeneut/.local/state/hermeneut
COPY --from=build /opt/hermeneut /opt/hermeneut
USER hermeneut:hermeneut
WORKDIR /var/lib/hermeneut
# the dashboard, and /metrics of collect, context watch, process, sink, alerts run and web (metrics.<stage>_port;
# set HERMENEUT_METRICS__HOST=0.0.0.0 for a Prometheus outside the container)
EXPOSE 8080 9471-9476
# The stages drain and flush on SIGTERM (docker stop); give them time with `stop_grace_period`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["hermeneut"]
CMD ["--help"]
