"""The alert rules and the Prometheus config, checked by Debian's promtool (``make test`` installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.prometheus_support import PROMETHEUS_DIR, binary, config_for

ALERTS = PROMETHEUS_DIR / "alerts.yml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_the_rules_are_valid_and_each_has_a_for_and_an_actionable_description() -> None:
    res = promtool("check", "rules", str(ALERTS))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 8 rules found" in res.stdout
    rules = [r for group in yaml.safe_load(ALERTS.read_text())["groups"] for r in group["rules"]]
    names = {r["alert"] for r in rules}
    assert {"DflashJobStalled", "DflashGpuIdle", "DflashAcceptLengthLow", "DflashRequestErrorsHigh"} <= names
    assert {"DflashRequestRetriesHigh", "DflashWorkerGone", "DflashServerDown", "DflashJobPaused"} <= names
    for rule in rules:
        assert rule.get("for"), f"{rule['alert']} has no for:"
        assert rule["labels"]["severity"] in ("page", "warn"), rule["alert"]
        assert len(rule["annotations"]["description"].split()) >= 20, rule["alert"]


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    # deploy/prometheus/alerts_test.yml: a stalled job, an idle GPU, a gone worker, a paused job
    res = promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS_DIR)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_the_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    # the idle-GPU rule that also fires for a GPU with nothing queued, and a stall rule without its wait
    shutil.copy(PROMETHEUS_DIR / "alerts_test.yml", tmp_path)
    text = ALERTS.read_text()
    for broken in (
        text.replace("(dflash_queue_depth) > 0)", "(dflash_queue_depth) >= 0)"),
        text.replace("increase(dflash_samples_total[10m])", "increase(dflash_samples_total[1m])"),
    ):
        assert broken != text
        (tmp_path / "alerts.yml").write_text(broken)
        res = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
        assert res.returncode == 1 and "FAILED" in res.stdout + res.stderr, res.stdout


def test_the_config_is_valid(tmp_path: Path) -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["rule_files"] = [str(ALERTS)]  # the compose path, /etc/prometheus/alerts.yml, is not here
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    res = promtool("check", "config", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    # and the test variant the live test runs with (file-based discovery only)
    path.write_text(yaml.safe_dump(config_for(tmp_path / "targets")))
    res = promtool("check", "config", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
