"""The Grafana dashboard and its provisioning, checked as files (Grafana is not packaged for
Debian and cannot run here): what Grafana needs to load them, and that every query names series
that exist: ours (the worker's registry), the simulator's and the pinned SGLang release's."""

from __future__ import annotations

import re
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dflash_tasks.monitoring import job_metrics, metrics
from tests.helpers import REPO
from tests.prometheus_support import dashboard, panels, queries, variables_in
from tests.sglang_wheel import WheelUnavailable, ensure_wheel

GRAFANA = REPO / "deploy" / "grafana"
DATASOURCES = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
PROVIDERS = yaml.safe_load((GRAFANA / "provisioning/dashboards/dflash.yml").read_text())
DOC = dashboard()
#: Grafana's own variables, which need no definition.
BUILTIN = {"__rate_interval", "__interval", "__range", "__range_s"}
_NAME = re.compile(r"\b((?:dflash_|sglang:)[a-z_:]+)\b(?!\s*\()")
ROWS = ["Progress and cost", "Throughput", "Speculative decoding", "Health and faults", "The servers"]


def names_in(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def our_series() -> set[str]:
    """Every series name a worker serves: its registry's families, with their sample suffixes."""
    found: set[str] = set()
    for family in metrics.REGISTRY.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        found |= {family.name + s for s in suffixes}
    # the collectors that only yield with data: their names as written in their modules
    for module in (metrics, job_metrics):
        found |= set(re.findall(r'"(dflash_[a-z_]+)"', Path(str(module.__file__)).read_text()))
    return found


def sim_series() -> set[str]:
    from dflash_tasks.sim import info

    text = Path(str(info.__file__)).read_text()
    gauges = re.search(r"gauges = \{(.*?)\}", text, re.S)
    assert gauges is not None
    return {"sglang:" + n for n in re.findall(r'"(\w+)":', gauges.group(1))} | {
        "sglang:" + n for n in re.findall(r'"(\w+_total)":', text)
    }


def test_the_datasource_and_the_dashboard_provider() -> None:
    (source,) = DATASOURCES["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert source["uid"] == "dflash-prometheus" and source["isDefault"] is True
    (provider,) = PROVIDERS["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_dashboard_has_what_grafana_needs() -> None:
    assert DOC["uid"] == "dflash-run" and DOC["title"] and isinstance(DOC["schemaVersion"], int)
    ids = [p["id"] for p in DOC["panels"]]
    assert len(ids) == len(set(ids)), Counter(ids).most_common(3)
    uid = DATASOURCES["datasources"][0]["uid"]
    for panel in panels(DOC):
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert panel["type"] in ("timeseries", "stat", "gauge"), panel["title"]
        assert panel["description"], panel["title"]  # what it shows and what to do when it looks wrong
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid and target["expr"].strip()
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
    for variable in DOC["templating"]["list"]:
        assert variable["datasource"]["uid"] == uid
        assert variable["type"] == "query" and "label_values(" in variable["query"]["query"]


def test_one_row_per_concern() -> None:
    assert [p["title"] for p in DOC["panels"] if p["type"] == "row"] == ROWS


def test_every_variable_a_query_uses_is_defined_and_every_defined_one_is_used() -> None:
    defined = {v["name"] for v in DOC["templating"]["list"]}
    assert defined == {"job", "gpu"}
    used: set[str] = set()
    for where, expr in queries(DOC):
        unknown = variables_in(expr) - defined - BUILTIN
        assert not unknown, f"{where}: {unknown}"
        used |= variables_in(expr)
    assert defined <= used


def test_every_query_names_series_that_exist() -> None:
    ours, sim = our_series(), sim_series()
    for where, expr in queries(DOC):
        names = names_in(expr)
        assert names or re.match(r"min by \(gpu\) \(up\{", expr), where  # else Prometheus's own `up`
        for name in names:
            if name.startswith("dflash_"):
                assert name in ours, f"{where}: {name} is not a series of ours"
            else:
                assert name in sim, f"{where}: the simulator serves no {name}"


def test_the_sglang_series_exist_in_the_pinned_release() -> None:
    try:
        wheel = ensure_wheel()
    except WheelUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    with zipfile.ZipFile(wheel) as z:
        source = z.read("sglang/srt/observability/metrics_collector.py").decode()
    served = set(re.findall(r'"(sglang:[a-z_]+)"', source))
    assert len(served) > 20  # the collector is where SGLang names its series
    used = {n for _, expr in queries(DOC) for n in names_in(expr) if n.startswith("sglang:")}
    assert used and used <= served, used - served
