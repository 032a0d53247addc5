# agent-envs: the package, its CLI as entrypoint, and the tool-sandbox runtime (tesseract,
# bubblewrap, python with numpy/sympy/Pillow/pytesseract).  The same image also serves as the
# image of the docker sandbox backend (tag it agent-envs-sandbox:latest too).  See docs/docker.md.
#
#   docker build -t agent-envs -t agent-envs-sandbox:latest .
#   docker run --rm -v "$PWD/runs:/runs" agent-envs eval --out /runs/x ...
#
# Without a registry, BASE can be the Debian image that docker/debian_base.sh builds with
# debootstrap (python 3.11 in a venv first on PATH), as CI does:
#   docker/debian_base.sh && DOCKER_BUILDKIT=0 docker build --network host \
#     --build-arg BASE=agent-envs-base:bookworm -t agent-envs -t agent-envs-sandbox:latest .
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

RUN apt-get update \
 && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng bubblewrap procps \
    fonts-dejavu-core fonts-dejavu-extra fonts-liberation \
 && rm -rf /var/lib/apt/lists/*

# pip is removed at the end: sandboxed commands must not install anything (docs/protocol.md#tool-sandbox)
COPY . /tmp/agent-envs-src
RUN pip install --no-cache-dir /tmp/agent-envs-src sympy \
 && rm -rf /tmp/agent-envs-src \
 && pip uninstall -y pip

# /workspace is deliberately absent: sandboxes mount a mode-1777 tmpfs there.
ENV PIP_NO_INDEX=1 \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["agent-envs"]
CMD ["--help"]
