"""docker-compose.yml and deploy/ checked as files (docker cannot run here): services, GPU
binding, Redis durability, Flower exposure, secrets, the CPU profile, scripts and units."""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_tasks.core.settings import ROLES
from tests.model_configs import QWEN36_27B
from workers.node.launch import sglang_command
from workers.node.profiles import choose_profile

REPO = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (REPO / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
GPUS = sorted(int(m.group(1)) for name in SERVICES if (m := re.fullmatch(r"sglang-gpu(\d+)", name)))
ENV_EXAMPLE = (REPO / "deploy" / "env.example").read_text()
SETTINGS_VARS = {f"DFLASH_{f.name.upper()}" for role in ROLES for f in dataclasses.fields(role)}
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str) -> str:
    """Compose's interpolation with nothing set: ``${VAR:-default}`` -> default, ``${VAR}`` -> "",
    ``${VAR:?error}`` -> ``<VAR>`` (a placeholder for the value .env must give); ``$$`` -> ``$``."""

    def value(m: re.Match[str]) -> str:
        op = m.group(2) or ""
        if op.endswith("?"):
            return f"<{m.group(1)}>"
        return m.group(3) if op.endswith("-") else ""

    return _VAR.sub(value, text).replace("$$", "$")


def argv(service: dict[str, Any]) -> list[str]:
    """The command as compose runs it: a string is interpolated, then split like a shell would."""
    command = service["command"]
    return (
        shlex.split(interpolate(command)) if isinstance(command, str) else [interpolate(p) for p in command]
    )


def in_profile(profile: str) -> set[str]:
    return {name for name, svc in SERVICES.items() if profile in svc.get("profiles", [])}


def test_seven_gpu_pairs_by_default() -> None:
    assert list(range(7)) == GPUS
    for gpu in GPUS:
        assert f"worker-gpu{gpu}" in SERVICES
    assert {"redis", "flower"} <= set(SERVICES)


@pytest.mark.parametrize("gpu", range(7))
def test_each_worker_is_bound_to_its_own_server(gpu: int) -> None:
    worker = SERVICES[f"worker-gpu{gpu}"]
    env = worker["environment"]
    assert env["DFLASH_ENDPOINT"] == f"http://sglang-gpu{gpu}:30000"
    assert env["DFLASH_WORKER_NAME"].startswith(f"gpu{gpu}@")
    assert worker["depends_on"] == {f"sglang-gpu{gpu}": {"condition": "service_healthy"}}
    assert worker["command"] == ["python", "-m", "workers"]
    assert "inspect ping" in " ".join(worker["healthcheck"]["test"])
    assert "$$DFLASH_WORKER_NAME" in " ".join(worker["healthcheck"]["test"])  # pings only itself
    assert worker["restart"] == "unless-stopped"
    assert worker["stop_grace_period"] == "15m"  # warm shutdown: running chunks finish
    assert interpolate(env["DFLASH_BROKER_URL"]).startswith("redis://:")


def test_gpu_reservations_are_distinct_and_pinned() -> None:
    ids: list[str] = []
    for gpu in GPUS:
        (device,) = SERVICES[f"sglang-gpu{gpu}"]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == [str(gpu)]
        ids += device["device_ids"]
    assert len(ids) == len(set(ids)) == 7
    for name, svc in SERVICES.items():
        if not name.startswith("sglang-"):
            assert "deploy" not in svc, f"{name} reserves a GPU"


def test_servers_run_sglang_with_the_launchers_flags() -> None:
    # The seed (an MTP model): the launcher's mtp profile. Other models: SGLANG_SPEC_ARGS
    # (tests/deploy/test_sglang_release.py checks those lines against SGLang's CLI).
    mtp = choose_profile("/models/M", QWEN36_27B)
    ours = sglang_command("python3", "/models/M", 30000, 48, profile=mtp)[3:]
    expected = {a for a in ours if a.startswith("--")}
    for gpu in GPUS:
        svc = SERVICES[f"sglang-gpu{gpu}"]
        assert svc["entrypoint"] == ["python3", "-m", "sglang.launch_server"]
        args = argv(svc)
        assert {a for a in args if a.startswith("--")} == expected
        flag = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
        assert flag["--speculative-algorithm"] == "NEXTN"
        steps, topk, draft = (
            int(flag[f"--speculative-{k}"]) for k in ("num-steps", "eagle-topk", "num-draft-tokens")
        )
        assert topk == 1 and draft == steps + 1
        assert flag["--reasoning-parser"] == "qwen3"
        assert flag["--max-running-requests"] == flag["--cuda-graph-max-bs-decode"] == "48"
        assert "${DFLASH_MAX_INFLIGHT:-48}" in svc["command"]  # the same variable the workers read
        assert flag["--port"] == "30000" and flag["--model-path"].startswith("/models/")
        assert "/health_generate" in " ".join(svc["healthcheck"]["test"])
        assert svc["restart"] == "unless-stopped"
        (volume,) = svc["volumes"]
        assert interpolate(volume) == "/dev/shm/models:/models:ro"  # the seed from RAM disk


def test_redis_is_durable_private_and_password_protected() -> None:
    redis = SERVICES["redis"]
    script = " ".join(redis["command"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in script
    assert "requirepass" in script and '"$$REDIS_PASSWORD"' in script
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert redis["volumes"] == ["redis-data:/data"] and "redis-data" in COMPOSE["volumes"]
    assert "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])
    assert [interpolate(p) for p in redis["ports"]] == ["127.0.0.1:6379:6379"]
    assert redis["restart"] == "unless-stopped"


def test_flower_needs_auth_and_is_published_on_loopback_only() -> None:
    flower = SERVICES["flower"]
    auth = flower["environment"]["FLOWER_BASIC_AUTH"]
    assert "${FLOWER_PASSWORD:?" in auth and "${FLOWER_USER" in auth
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    assert flower["command"][:4] == ["celery", "-A", "dflash_tasks.celery_app", "flower"]


def test_no_service_publishes_on_all_interfaces() -> None:
    for name, svc in SERVICES.items():
        for port in svc.get("ports", []):
            published = interpolate(str(port))
            assert published.count(":") == 2 and published.startswith("127.0.0.1:"), (name, port)


def test_no_literal_secrets() -> None:
    for name, svc in SERVICES.items():
        env = svc.get("environment") or {}
        for key, value in env.items():
            if re.search(r"PASSWORD|SECRET|AUTH|TOKEN|KEY", key):
                assert value is None or "${" in str(value), f"{name}: {key} is a literal"
            if isinstance(value, str) and "redis://" in value:
                assert re.search(r"redis://:\$\{REDIS_PASSWORD", value), (
                    f"{name}: {key} has a literal password"
                )
    assert not re.search(r"requirepass\s+[\"']?[A-Za-z0-9]", COMPOSE_TEXT)
    assert not re.search(r"(?i)password\s*[:=]\s*[\"']?(?!\$)[A-Za-z0-9]", COMPOSE_TEXT)
    assert "change-me" not in COMPOSE_TEXT


def test_settings_names_exist_and_required_variables_are_in_env_example() -> None:
    for name, svc in SERVICES.items():
        for key in svc.get("environment") or {}:
            if key.startswith("DFLASH_"):
                assert key in SETTINGS_VARS, f"{name}: {key} is no settings field"
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE_TEXT))
    assert required == {"REDIS_PASSWORD", "FLOWER_PASSWORD", "GRAFANA_PASSWORD", "MODEL_NAME"}
    example = dict(line.split("=", 1) for line in ENV_EXAMPLE.splitlines() if re.match(r"^[A-Z_]+=", line))
    assert required <= set(example)
    for key in example:
        if key.startswith("DFLASH_"):
            assert key in SETTINGS_VARS, f"env.example: {key} is no settings field"


def test_cpu_profile_runs_the_same_stack_on_the_simulator() -> None:
    cpu = in_profile("cpu")
    assert {"redis", "flower", "sim-gpu0", "sim-gpu1", "worker-sim0", "worker-sim1"} | MONITORING == cpu
    assert not any(name.startswith("sglang-") for name in cpu)
    for i in (0, 1):
        sim = SERVICES[f"sim-gpu{i}"]
        args = argv(sim)
        assert args[:3] == ["python", "-m", "dflash_tasks.sim"]
        assert args[args.index("--port") + 1] == "30000"
        assert args[args.index("--max-running-requests") + 1] == "48"
        assert "/health_generate" in " ".join(sim["healthcheck"]["test"])
        worker = SERVICES[f"worker-sim{i}"]
        assert worker["environment"]["DFLASH_ENDPOINT"] == f"http://sim-gpu{i}:30000"
        assert worker["depends_on"] == {f"sim-gpu{i}": {"condition": "service_healthy"}}
    gpu, join = in_profile("gpu"), in_profile("join")
    assert {"redis", "flower", *MONITORING} <= gpu and not {"redis", "flower", *MONITORING} & join
    assert join == {n for n in SERVICES if re.fullmatch(r"(sglang|worker)-gpu\d+", n)} <= gpu


MONITORING = {"prometheus", "grafana"}


def test_prometheus_and_grafana_are_pinned_mounted_from_the_repo_and_on_loopback() -> None:
    prom, grafana = SERVICES["prometheus"], SERVICES["grafana"]
    for svc, default in ((prom, "prom/prometheus:v"), (grafana, "grafana/grafana:")):
        image = interpolate(svc["image"])
        assert image.startswith(default) and re.search(r":v?\d+\.\d+\.\d+$", image), image  # no latest
        assert svc["restart"] == "unless-stopped"
    assert [interpolate(p) for p in prom["ports"]] == ["127.0.0.1:9090:9090"]
    assert [interpolate(p) for p in grafana["ports"]] == ["127.0.0.1:3000:3000"]
    pairs = [interpolate(v).split(":")[:2] for v in prom["volumes"] + grafana["volumes"]]
    mounts = {inside: outside for outside, inside in pairs}
    for inside, repo_path in (
        ("/etc/prometheus/prometheus.yml", "deploy/prometheus/prometheus.yml"),
        ("/etc/prometheus/alerts.yml", "deploy/prometheus/alerts.yml"),
        ("/etc/prometheus/targets", "deploy/prometheus/targets"),
        ("/etc/grafana/provisioning", "deploy/grafana/provisioning"),
        ("/var/lib/grafana/dashboards", "deploy/grafana/dashboards"),
    ):
        assert mounts[inside] == f"./{repo_path}" and (REPO / repo_path).exists(), inside
    assert "--config.file=/etc/prometheus/prometheus.yml" in argv(prom)
    env = grafana["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "${GRAFANA_PASSWORD:?set GRAFANA_PASSWORD in .env}"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / "deploy/grafana/dashboards" / Path(home).name).is_file()
    # the workers serve their metrics inside the compose network, where Prometheus scrapes them
    assert COMPOSE["x-worker-env"]["DFLASH_METRICS_ADDRESS"] == "0.0.0.0"
    assert not any("9808" in str(p) for svc in SERVICES.values() for p in svc.get("ports", []))


def test_prometheus_finds_every_compose_worker_and_server() -> None:
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    names = {
        "dflash-workers": {n for n in SERVICES if n.startswith("worker-")},
        "sglang": {n for n in SERVICES if n.startswith(("sglang-", "sim-"))},
    }
    for job, services in names.items():
        (dns,) = jobs[job]["dns_sd_configs"]
        assert services <= set(dns["names"]), (job, services - set(dns["names"]))
        assert dns["port"] == (9808 if job == "dflash-workers" else 30000)
        (files,) = jobs[job]["file_sd_configs"]
        assert files["files"] == ["/etc/prometheus/targets/*.json"]
    assert jobs["dflash-workers"]["honor_labels"] is True  # our `job` label is the dflash job id


def test_project_image_is_built_from_the_dockerfile() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install ." in dockerfile and "USER dflash" in dockerfile
    for name in ("flower", "worker-gpu0", "sim-gpu0"):
        assert SERVICES[name]["build"] == "."


# --- deploy/ --------------------------------------------------------------------------------------

SCRIPTS = sorted((REPO / "deploy").glob("*.sh"))


def test_deploy_has_the_operator_scripts() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"install.sh", "stage-model.sh", "start-node.sh", "stop-node.sh", "tail-logs.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_strict_and_parse(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)
    for var in set(re.findall(r"\bDFLASH_[A-Z_]+", text)):
        assert var in SETTINGS_VARS, f"{script.name}: {var} is no settings field"
    if shutil.which("shellcheck"):
        res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def test_stage_model_copies_once_and_atomically(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "shm" / "models" / "M"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"w" * 4096)
    (src / "sub" / "link.safetensors").symlink_to(src / "model.safetensors")  # HF cache snapshots
    cmd = ["bash", str(REPO / "deploy" / "stage-model.sh"), str(src), str(dest)]
    env = {"PATH": "/usr/bin:/bin", "ENV_FILE": str(tmp_path / "none")}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    assert (dest / "sub" / "link.safetensors").read_bytes() == b"w" * 4096
    assert not (dest / "sub" / "link.safetensors").is_symlink()
    assert not dest.with_name("M.partial").exists()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "already staged" in again.stdout
    missing = subprocess.run([*cmd[:2], str(tmp_path / "nope")], capture_output=True, text=True, env=env)
    assert missing.returncode == 1 and "is not a directory" in missing.stderr


def test_systemd_node_unit_stops_workers_before_servers() -> None:
    unit = (REPO / "deploy" / "systemd" / "dflash-node.service").read_text()
    assert "KillMode=mixed" in unit  # SIGTERM to the node only; it stops its children in order
    stop = int(re.search(r"TimeoutStopSec=(\d+)", unit).group(1))  # type: ignore[union-attr]
    assert stop > 600 + 60  # the node's worker and server stop timeouts
    assert "EnvironmentFile=/etc/dflash/node.env" in unit and "stage-model.sh" in unit
    conf = (REPO / "deploy" / "systemd" / "redis.conf").read_text()
    for line in ("appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction"):
        assert f"\n{line}\n" in conf
    assert "requirepass" not in conf.replace('requirepass "..."', "")  # the password lives elsewhere
