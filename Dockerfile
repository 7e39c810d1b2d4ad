# The appliance image: the daemon (`appliance serve`) with the training stack, installed offline.
#
#   images/build-wheelhouse gpu images/wheelhouse        # on a connected build host: the locked wheels
#   podman build -t localhost/appliance:0.1.0 \
#     --build-arg REVISION=$(git rev-parse HEAD) --build-arg BASE_DIGEST=sha256:... .   # or docker build
#
# The dependencies install with no network; the gpu profile also installs gcc from Debian's archive
# (Triton and vLLM compile at run time) unless the base already has one. Record the base by digest:
# BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:... and the same digest in BASE_DIGEST.
#
# BASE_IMAGE needs CPython 3.11 with the venv module, libstdc++ and libgomp on glibc (x86_64). The default is Debian
# bookworm's Python 3.11 image: the CUDA user-space libraries come with torch's and vLLM's wheels
# (nvidia-* packages in the gpu wheelhouse) and the driver from the host through CDI, so a CUDA
# base image would only carry a second copy. CI builds the cpu profile FROM a local bookworm root
# made by images/build-base (no registry is reachable there).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG BASE_IMAGE

# The ids are fixed so that the host's sysusers.d entry (systemd/appliance.sysusers.conf) gives
# the same numbers: the socket's group and the state files' owner mean the same on both sides.
ARG APPLIANCE_UID=10001
ARG APPLIANCE_GID=10001

# Two layers. The dependencies (multi-GB) first: the wheelhouse is bind-mounted, not copied, so it never
# becomes part of the image; the project's wheel lies beside it (images/wheelhouse-app), so that a code
# change keeps this layer. Then the application's own wheel, a thin layer on top.
RUN --mount=type=bind,source=images/install,target=/tmp/install \
    --mount=type=bind,source=images/wheelhouse,target=/tmp/wheels \
    sh /tmp/install deps /tmp/wheels "${APPLIANCE_UID}" "${APPLIANCE_GID}"
RUN --mount=type=bind,source=images/install,target=/tmp/install \
    --mount=type=bind,source=images/wheelhouse-app,target=/tmp/app \
    sh /tmp/install app /tmp/app

# OCI labels (images/ci-build-check and a release build pass the revision and the base's digest).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG BASE_DIGEST=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="appliance" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

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

# /models: the model store, mounted read-only. /var/lib/appliance: jobs, database, audit log.
# /run/appliance: the control socket, shared with the host so operators reach it over SSH.
VOLUME ["/var/lib/appliance"]
USER appliance
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
