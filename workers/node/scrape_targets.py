"""The node's Prometheus targets, as a file-based service discovery list (``file_sd_configs``).

``python -m workers.node`` writes one JSON file per node: for each GPU, its SGLang server's
``/metrics`` and its worker's metrics endpoint, labelled with the role, the GPU (``gpuN``) and
the node. Prometheus reads every such file it is given (``deploy/prometheus/prometheus.yml``,
``files: [/etc/prometheus/targets/*.json]``) and notices new and changed ones by itself, so a
node that joins only has to get its file there (a shared folder, or a copy).

Addresses: the servers listen on the node's loopback and the workers on
``DFLASH_METRICS_ADDRESS`` (loopback by default), so the file names ``host`` (``--scrape-host``;
default the metrics address, or this machine's name when that is a wildcard). A Prometheus on
another machine needs the workers bound to a reachable address, and the servers' metrics
proxied or scraped by a Prometheus on the node (docs/monitoring.md).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.node.launch import GpuPlan

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def scrape_host(metrics_address: str, given: str = "") -> str:
    """The host other machines reach this node's targets at."""
    if given:
        return given
    return socket.gethostname() if metrics_address in WILDCARDS else metrics_address


def target_groups(
    plans: Sequence[GpuPlan], node: str, metrics_port_base: int, host: str
) -> list[dict[str, Any]]:
    """One group per target: the servers (``role=sglang``) and, when metrics are on, the workers."""
    groups: list[dict[str, Any]] = []
    for plan in plans:
        labels = {"node": node, "gpu": plan.name}
        groups.append({"targets": [f"{host}:{plan.port}"], "labels": {**labels, "role": "sglang"}})
        if metrics_port_base > 0:
            port = metrics_port_base + plan.gpu
            groups.append({"targets": [f"{host}:{port}"], "labels": {**labels, "role": "worker"}})
    return groups


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    """Write ``groups`` to ``path`` atomically (Prometheus may read it at any moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(groups, fh, indent=1)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
