# One image for every Mercury node (root, replicas, consumer nodes).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libdeflate-dev libsodium-dev libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY core core
COPY mercury mercury
COPY store store
COPY gateway gateway
COPY replicator replicator
COPY acl acl
COPY migrations migrations
COPY reads reads
COPY ha ha
RUN pip install --no-cache-dir Cython setuptools wheel \
    && pip install --no-cache-dir . \
    && python setup.py build_ext --inplace
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["mercury"]
