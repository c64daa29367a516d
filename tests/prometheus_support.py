"""Prometheus in tests: Debian's ``prometheus`` package (``make test`` installs it, with
``promtool``), started on a free port with a generated config; the dashboard's queries."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.helpers import REPO, free_port, wait_until

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "dflash.json"


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; fails the test, saying how to get it, when missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: `make test` installs Debian's prometheus package "
            "(scripts/ensure_prometheus.sh), or run `apt-get install prometheus`",
            pytrace=False,
        )
    return path


def config_for(targets_dir: Path, scrape_interval: str = "1s") -> dict[str, Any]:
    """The repo's Prometheus config for a test: only its file-based discovery (the compose DNS
    names do not resolve here), reading ``targets_dir``, scraping every ``scrape_interval``."""
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval}
    config["rule_files"] = [str(PROMETHEUS_DIR / "alerts.yml")]
    for job in config["scrape_configs"]:
        job.pop("dns_sd_configs", None)
        for sd in job["file_sd_configs"]:
            sd["files"] = [str(targets_dir / "*.json")]
            sd["refresh_interval"] = "1s"
    return config


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query (raises on a query Prometheus refuses)."""
        res = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = res.json()
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus refused {expr!r}: {body.get('error')}")
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        """The one value of a query returning a single series; None when it returns none."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        res = requests.get(f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=10)
        return list(res.json()["data"]["activeTargets"])


def start_prometheus(workdir: Path, config: dict[str, Any]) -> Prometheus:
    """Start ``prometheus`` on a free loopback port with ``config``; returns once it is ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError("prometheus exited: " + (workdir / "prometheus.log").read_text()[-2000:])
        try:
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_until(ready, 30, "prometheus to be ready", interval=0.2)
    return Prometheus(url, proc)


def stop(prom: Prometheus) -> None:
    if prom.proc.poll() is None:
        prom.proc.terminate()
        try:
            prom.proc.wait(10)
        except subprocess.TimeoutExpired:
            prom.proc.kill()
            prom.proc.wait(5)


# --- the dashboard --------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that queries (rows and their nested panels flattened)."""
    for panel in doc["panels"]:
        yield from (p for p in panel.get("panels", []) if p.get("targets"))
        if panel.get("targets"):
            yield panel


def queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(panel title / refId, PromQL)`` of every query of the dashboard."""
    for panel in panels(doc):
        for target in panel["targets"]:
            yield f"{panel['title']} / {target['refId']}", str(target["expr"])


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}")


def variables_in(expr: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in _VARIABLE.finditer(expr)}


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's variables replaced, as Grafana would send it."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(value, expr)
