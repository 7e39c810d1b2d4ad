# The appliance image: the daemon (`appliance serve`) with the training stack, installed offline.
#
#   images/build-wheelhouse gpu images/wheelhouse     # on a connected build host: the locked wheels
#   images/build-image localhost/appliance:0.1.0      # podman build, labelled with revision and base digest
#
# The dependencies install with no network and nothing comes from an archive: the gpu profile needs gcc
# (Triton and vLLM compile at run time), which its base brings (images/build-base TAG gpu, every Debian
# package pinned by version in images/locks/base-gpu.txt). Record the base by digest:
# BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:... (images/build-image labels the image
# with the digest it built from).
#
# BASE_IMAGE needs CPython 3.11 with the venv module, libstdc++ and libgomp on glibc (x86_64). The default is Debian
# bookworm's Python 3.11 image: the CUDA user-space libraries come with torch's and vLLM's wheels
# (nvidia-* packages in the gpu wheelhouse) and the driver from the host through CDI, so a CUDA
# base image would only carry a second copy. CI builds the cpu profile FROM a local bookworm root
# made by images/build-base (no registry is reachable there).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG BASE_IMAGE

# Everything that does not change with the build comes before the dependencies, so that a layered build
# (podman's default) caches it once; the per-build labels (revision, base digest) are given on the command
# line by images/build-image, after the last layer.
LABEL org.opencontainers.image.title="appliance" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"

# Nothing in the image may reach a network (DESIGN "No network, ever"); appliance.offline sets
# the same variables again before any ML library loads.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    TOKENIZERS_PARALLELISM=false \
    APPLIANCE_DATA_DIR=/var/lib/appliance \
    APPLIANCE_MODELS_DIR=/models \
    PATH=/opt/appliance/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/var/lib/appliance/cache/huggingface \
    TRITON_CACHE_DIR=/var/lib/appliance/cache/triton \
    VLLM_CACHE_ROOT=/var/lib/appliance/cache/vllm \
    TORCHINDUCTOR_CACHE_DIR=/var/lib/appliance/cache/torchinductor \
    XDG_CACHE_HOME=/var/lib/appliance/cache

WORKDIR /var/lib/appliance
EXPOSE 9464

# The control API answers on the socket only when the daemon is up and its job store is open.
HEALTHCHECK --interval=30s --timeout=10s --start-period=10m --retries=3 \
    CMD ["appliance", "jobs", "list", "--json"]

ENTRYPOINT ["appliance", "serve"]
# Metrics on every interface of the container's own network namespace, so that a published port
# reaches them; the units publish it on the host's loopback only (127.0.0.1:9464). A stop gives
# running steps 150 s to checkpoint, inside the units' 170 s container stop timeout.
CMD ["--data-dir", "/var/lib/appliance", "--socket", "/run/appliance/control.sock", "--group", "appliance", "--metrics-addr", "0.0.0.0:9464", "--stop-timeout", "150"]

# The ids are fixed so that the host's sysusers.d entry (systemd/appliance.sysusers.conf) gives
# the same numbers: the socket's group and the state files' owner mean the same on both sides.
ARG APPLIANCE_UID=10001
ARG APPLIANCE_GID=10001

# Two layers: the dependencies (multi-GB), then the application's own wheel, thin, on top. The wheels are
# bind-mounted, never copied into the image. A builder may cache a RUN by its text alone (podman 4.3
# does, whatever the mounted files hold), so each RUN follows a COPY of what it installs from: the
# lock (every wheel's sha256) and the install script, then the application wheel's sha256. COPY is
# content-addressed: a new lock rebuilds the dependencies, a code change only the application layer.
COPY images/install /opt/appliance/share/install
COPY images/wheelhouse/requirements.txt /opt/appliance/share/requirements.lock
RUN --mount=type=bind,source=images/wheelhouse,target=/tmp/wheels \
    sh /opt/appliance/share/install deps /tmp/wheels "${APPLIANCE_UID}" "${APPLIANCE_GID}"
COPY images/wheelhouse-app/appliance.sha256 /opt/appliance/share/appliance.sha256
RUN --mount=type=bind,source=images/wheelhouse-app,target=/tmp/app \
    sh /opt/appliance/share/install app /tmp/app

# /models: the model store, mounted read-only. /var/lib/appliance: jobs, database, audit log.
# /run/appliance: the control socket, shared with the host so operators reach it over SSH.
# (After the RUNs: a builder may drop what a RUN writes under a declared volume.)
VOLUME ["/var/lib/appliance"]
USER appliance
