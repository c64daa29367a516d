# The dflash-tasks image: workers, Flower, the producer CLIs and the simulator (no SGLang: the
# GPU servers run the official SGLang image, see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py ./
COPY dflash_tasks ./dflash_tasks
COPY workers ./workers
RUN pip install . \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin dflash

# docker-compose.yml overrides the user with RUN_AS (default 1000:1000, the owner of DATA_DIR).
USER dflash
CMD ["python", "-m", "workers"]
