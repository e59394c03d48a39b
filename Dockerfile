# One image for every IgnisMQ part: the command picks the role
# (ignis operator | ignis sweeper | ignis pipeline ... | ignis publish/consume ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ignis ./ignis
COPY operator ./operator
COPY workers ./workers
COPY pipeline ./pipeline
# The pipeline (ignis pipeline ..., spark-submit of ignis_pipeline/jobs) runs Spark, which needs Java 17+.
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install '.[spark]' && useradd --uid 10001 --no-create-home ignis && mkdir /data && chown 10001 /data
USER 10001
# The embedded default store lives here when no aerospike:// URL is configured.
ENV IGNIS_STORE=lmdb:///data
VOLUME ["/data"]
ENTRYPOINT ["ignis"]
CMD ["--help"]
