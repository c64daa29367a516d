"""Tests for dflash_tasks.core.settings: the role classes, DFLASH_* parsing, overrides, validation,
URL redaction."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.setting_values import inflight_overrides, parse_inflight, redact_url
from dflash_tasks.core.settings import (
    DEFAULT_MAX_INFLIGHT,
    ROLES,
    CommonSettings,
    MonitorSettings,
    NodeSettings,
    ProducerSettings,
    ProgressSettings,
    WorkerSettings,
)

ALL_CLASSES = (*ROLES, ProgressSettings)


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_defaults_without_environment(role: type[CommonSettings]) -> None:
    s = role.load({})
    assert s == role()
    assert s.broker_url == "redis://127.0.0.1:6379/0"
    assert s.queue == "dflash"
    assert s.lease_seconds == 60.0


def test_worker_defaults() -> None:
    s = WorkerSettings.load({})
    assert s == WorkerSettings()
    assert s.max_inflight == 48
    assert s.lease_seconds == 60.0


def test_load_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_QUEUE", "from-os-environ")
    monkeypatch.setenv("DFLASH_MAX_INFLIGHT", "7")
    s = WorkerSettings.load()
    assert s.queue == "from-os-environ"
    assert s.max_inflight == 7


def test_env_values_are_parsed_by_type() -> None:
    env = {
        "DFLASH_BROKER_URL": "redis://10.0.0.5:6380/2",
        "DFLASH_QUEUE": "gpu-queue",
        "DFLASH_MAX_INFLIGHT": "96",
        "DFLASH_REQUEST_ATTEMPTS": " 3 ",
        "DFLASH_LEASE_SECONDS": "30.5",
        "DFLASH_HEARTBEAT_SECONDS": "5",
        "DFLASH_VISIBILITY_TIMEOUT": "7200",
        "DFLASH_RETRY_BACKOFF": "1e-1",
        "DFLASH_WORKER_NAME": "gpu0@host",
        "DFLASH_LOG_LEVEL": "DEBUG",
    }
    s = WorkerSettings.load(env)
    assert s.broker_url == "redis://10.0.0.5:6380/2"
    assert s.queue == "gpu-queue"
    assert s.max_inflight == 96 and type(s.max_inflight) is int
    assert s.request_attempts == 3
    assert s.lease_seconds == 30.5 and type(s.lease_seconds) is float
    assert s.heartbeat_seconds == 5.0 and type(s.heartbeat_seconds) is float
    assert s.visibility_timeout == 7200 and type(s.visibility_timeout) is int
    assert s.retry_backoff == pytest.approx(0.1)
    assert s.worker_name == "gpu0@host"
    assert s.log_level == "DEBUG"


def changed_value(field: dataclasses.Field[Any]) -> Any:
    """A valid value that differs from the field's default, by type."""
    default = field.default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default + 1.5
    if field.name == "page_basic_auth":
        return "watcher:s3cret"  # user:password
    if field.name == "repetition":
        return "min_chars=2000"
    if field.name == "on_loop":
        return "prefix=2048"
    if field.name == "echo_logs":
        return "workers"  # one of all, workers, none
    return f"{default}9"  # keeps redis:// URLs valid


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_every_field_is_read_from_its_env_variable(role: type[CommonSettings]) -> None:
    values = {f.name: changed_value(f) for f in dataclasses.fields(role)}
    assert all(getattr(role(), k) != v for k, v in values.items())
    env = {f"DFLASH_{k.upper()}": str(v) for k, v in values.items()}
    s = role.load(env)
    assert dataclasses.asdict(s) == values
    assert all(type(getattr(s, k)) is type(v) for k, v in values.items())


def test_empty_env_values_are_ignored() -> None:
    s = WorkerSettings.load({"DFLASH_MAX_INFLIGHT": "", "DFLASH_QUEUE": ""})
    assert s.max_inflight == 48
    assert s.queue == "dflash"


def test_other_variables_are_ignored() -> None:
    s = WorkerSettings.load({"QUEUE": "x", "dflash_queue": "y", "DFLASH_UNKNOWN": "z", "DFLASHQUEUE": "w"})
    assert s.queue == "dflash"


def test_overrides_beat_env() -> None:
    env = {"DFLASH_QUEUE": "env-q", "DFLASH_MAX_INFLIGHT": "10", "DFLASH_BROKER_URL": "redis://env:1/0"}
    s = WorkerSettings.load(env, queue="cli-q", max_inflight=20)
    assert s.queue == "cli-q"
    assert s.max_inflight == 20
    assert s.broker_url == "redis://env:1/0"


def test_none_overrides_are_ignored() -> None:
    env = {"DFLASH_QUEUE": "env-q", "DFLASH_BROKER_URL": "redis://env:1/0"}
    s = WorkerSettings.load(env, queue=None, broker_url=None, max_inflight=None)
    assert s.queue == "env-q"
    assert s.broker_url == "redis://env:1/0"
    assert s.max_inflight == 48


def test_falsy_but_not_none_overrides_apply() -> None:
    env = {"DFLASH_BACKLOG_LOW_WATER": "5", "DFLASH_WORKER_NAME": "env"}
    s = WorkerSettings.load(env, backlog_low_water=0, worker_name="")
    assert s.backlog_low_water == 0
    assert s.worker_name == ""


@pytest.mark.parametrize(
    ("var", "raw", "kind"),
    [
        ("DFLASH_MAX_INFLIGHT", "many", "int"),
        ("DFLASH_MAX_INFLIGHT", "1.5", "int"),
        ("DFLASH_VISIBILITY_TIMEOUT", "12h", "int"),
        ("DFLASH_REQUEST_ATTEMPTS", "0x10", "int"),
        ("DFLASH_LEASE_SECONDS", "60s", "float"),
        ("DFLASH_REQUEST_TIMEOUT", "forever", "float"),
    ],
)
def test_invalid_env_values_name_the_variable(var: str, raw: str, kind: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkerSettings.load({var: raw})
    message = str(info.value)
    assert var in message
    assert repr(raw) in message
    assert kind in message


@pytest.mark.parametrize(
    "var", ["DFLASH_LEASE_SECONDS", "DFLASH_HEARTBEAT_SECONDS", "DFLASH_REQUEST_TIMEOUT"]
)
def test_nan_is_rejected(var: str) -> None:
    with pytest.raises(ConfigError, match=var):
        WorkerSettings.load({var: "nan"})


# -- validate ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"max_inflight": 0}, "max_inflight must be >= 1, got 0"),
        ({"max_inflight": -3}, "max_inflight must be >= 1, got -3"),
        ({"request_attempts": 0}, "request_attempts must be >= 1, got 0"),
        ({"max_chunks": 0}, "max_chunks must be >= 1, got 0"),
        ({"heartbeat_seconds": 0.0}, "heartbeat_seconds (0.0)"),
        ({"heartbeat_seconds": -1.0}, "heartbeat_seconds (-1.0)"),
        ({"lease_seconds": 10.0, "heartbeat_seconds": 10.0}, "lease_seconds (10.0) must exceed"),
        ({"lease_seconds": 5.0, "heartbeat_seconds": 10.0}, "lease_seconds (5.0) must exceed"),
        ({"visibility_timeout": 60}, "visibility_timeout must exceed lease_seconds"),
        ({"visibility_timeout": 30}, "visibility_timeout must exceed lease_seconds"),
        ({"broker_url": "amqp://guest@rabbit//"}, "broker_url must be a redis:// URL"),
        ({"broker_url": "127.0.0.1:6379"}, "broker_url must be a redis:// URL"),
    ],
)
def test_validate_rejects(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkerSettings().replace(**changes)
    assert fragment in str(info.value)
    with pytest.raises(ConfigError):
        WorkerSettings.load({}, **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_inflight": 1},
        {"request_attempts": 1},
        {"max_chunks": 1},
        {"lease_seconds": 10.5, "heartbeat_seconds": 10.0},
        {"visibility_timeout": 61},
        {"broker_url": "rediss://secure:6380/0"},
        {"broker_url": "unix:///run/redis.sock"},
    ],
)
def test_validate_accepts_boundaries(changes: dict[str, object]) -> None:
    s = WorkerSettings().replace(**changes)
    for name, value in changes.items():
        assert getattr(s, name) == value


def test_replace_returns_a_validated_copy() -> None:
    base = WorkerSettings()
    changed = base.replace(queue="other")
    assert changed.queue == "other"
    assert base.queue == "dflash"
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.queue = "x"  # type: ignore[misc]


def test_invalid_broker_url_message_hides_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        WorkerSettings.load({"DFLASH_BROKER_URL": "amqp://admin:hunter2@rabbit:5672//"})
    assert "hunter2" not in str(info.value)
    assert "rabbit:5672" in str(info.value)


def test_schemeless_broker_url_message_hides_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        WorkerSettings.load({"DFLASH_BROKER_URL": "admin:hunter2@10.0.0.5:6379/0"})
    assert "hunter2" not in str(info.value)


# -- redact_url --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:s3cret@host:6379/0", "redis://user:***@host:6379/0"),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
        ("redis://user:p@ss@w0rd@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://user:pa/ss:wd@host/0", "redis://user:***@host/0"),
        ("redis://user:pa%40ss@host/0", "redis://user:***@host/0"),
        ("unix://:s3cret@/run/redis.sock", "unix://:***@/run/redis.sock"),
        ("", ""),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@host:6379/0",
        "redis://default:s3cret@host:6379/0",
        "rediss://u:s3cret@h:1/0",
        "redis://u:xs3cret@y@h/0",
        "redis://u:s3cret:more@h/0",
    ],
)
def test_redact_url_never_shows_the_password(url: str) -> None:
    assert "s3cret" not in redact_url(url)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0?password=s3cret", "user:s3cret@host:6379/0"],
)
def test_redact_url_hides_query_and_schemeless_passwords(url: str) -> None:
    assert "s3cret" not in redact_url(url)


# -- low_water ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_inflight", "backlog_low_water", "expected"),
    [
        (48, 0, 24),  # default: half the in-flight budget
        (49, 0, 24),
        (256, 0, 128),
        (1, 0, 1),  # never 0
        (3, 0, 1),
        (48, 5, 5),  # explicit value wins
        (48, 100, 100),
        (48, -1, 24),  # not positive: automatic
    ],
)
def test_low_water(max_inflight: int, backlog_low_water: int, expected: int) -> None:
    s = WorkerSettings(max_inflight=max_inflight, backlog_low_water=backlog_low_water)
    assert s.low_water() == expected


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("DFLASH_RETRY_BACKOFF", "-1"),
        ("DFLASH_RETRY_BACKOFF_MAX", "-1"),
        ("DFLASH_REQUEST_TIMEOUT", "0"),
        ("DFLASH_RECONCILE_SECONDS", "0"),
        ("DFLASH_HEALTH_POLL_SECONDS", "-5"),
        ("DFLASH_REQUEUE_BACKOFF", "-1"),
        ("DFLASH_STORE_RETRY_SECONDS", "-1"),
    ],
)
def test_non_positive_timing_settings_are_rejected(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var.removeprefix("DFLASH_").lower()):
        WorkerSettings.load({var: raw})


# -- one class per role ------------------------------------------------------------------------------


def names(cls: type[CommonSettings]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_each_role_has_the_fields_its_processes_read() -> None:
    common = {"broker_url", "queue", "redis_prefix", "visibility_timeout", "lease_seconds", "s3_endpoint_url"}
    progress = common | {"progress_seconds", "gpu_hour_usd"}
    assert names(CommonSettings) == common
    producer = {"repair_rounds", "repair_spacing_seconds", "repetition", "on_loop", "max_tokens"}
    producer |= {"wait_replan_seconds", "preflight_timeout_seconds"}
    assert names(ProducerSettings) == progress | producer
    assert not names(WorkerSettings) & producer
    monitor = {"flower_password", "flower_max_tasks", "flower_purge_offline_seconds"}
    monitor |= {"page_basic_auth", "page_refresh_seconds"}
    assert names(MonitorSettings) == progress | monitor
    worker = names(WorkerSettings)
    assert progress < worker and not worker & monitor
    assert {"endpoint", "max_inflight", "heartbeat_seconds", "metrics_port"} <= worker
    node = {"gpus", "model_path", "port_base", "log_dir", "sglang_args", "sglang_python", "draft_model"}
    node |= {"echo_logs", "scrape_targets", "scrape_host", "max_failures", "restart_delay_seconds"}
    node |= {"health_interval_seconds", "server_start_timeout_seconds", "hang_restart_seconds"}
    node |= {"worker_stop_timeout_seconds", "server_stop_timeout_seconds"}
    assert not worker & node
    assert names(NodeSettings) == worker | node


def test_a_role_reads_only_its_own_variables_from_the_environment() -> None:
    others = {
        "DFLASH_MAX_INFLIGHT": "many",  # a worker's, and not even an int
        "DFLASH_PORT_BASE": "0",  # the node's, and out of range
        "DFLASH_FLOWER_PASSWORD": "hunter2",  # monitoring's secret
        "DFLASH_PROGRESS_SECONDS": "-1",  # progress writers'
        "DFLASH_QUEUE": "q",
    }
    common = CommonSettings.load(others)
    assert common.queue == "q" and not hasattr(common, "progress_seconds")
    producer = ProducerSettings.load({**others, "DFLASH_PROGRESS_SECONDS": "2"})
    assert producer.progress_seconds == 2.0
    assert not hasattr(producer, "max_inflight") and not hasattr(producer, "flower_password")
    with pytest.raises(ConfigError, match="progress_seconds"):
        ProducerSettings.load(others)
    worker = WorkerSettings.load({**others, "DFLASH_MAX_INFLIGHT": "7", "DFLASH_PROGRESS_SECONDS": "2"})
    assert worker.max_inflight == 7 and not hasattr(worker, "port_base")
    with pytest.raises(ConfigError, match="port_base"):
        NodeSettings.load({**others, "DFLASH_MAX_INFLIGHT": "7", "DFLASH_PROGRESS_SECONDS": "2"})
    assert MonitorSettings.load({**others, "DFLASH_PROGRESS_SECONDS": "2"}).flower_password == "hunter2"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_settings_are_frozen_slotted_dataclasses(role: type[CommonSettings]) -> None:
    s = role()
    assert not hasattr(s, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.queue = "x"  # type: ignore[misc]


def test_a_shared_field_has_one_definition() -> None:
    declared: dict[str, list[str]] = {}
    changed: dict[str, list[type[CommonSettings]]] = {}  # a base's field redeclared: another default
    for cls in ALL_CLASSES:
        for name in vars(cls).get("__annotations__", {}):
            if name in names(cls):
                if any(name in names(base) for base in cls.__mro__[1:] if base in ALL_CLASSES):
                    changed.setdefault(name, []).append(cls)
                else:
                    declared.setdefault(name, []).append(cls.__name__)
    assert {name: owners for name, owners in declared.items() if len(owners) != 1} == {}
    assert set(declared) == set().union(*(names(role) for role in ROLES))
    # one changed default, on purpose: the node launcher tunes (docs/performance.md)
    assert changed == {"tune_inflight": [NodeSettings]}
    for name in declared:  # hence one default, whichever role reads it, but where a role changes it
        defaults = {
            role.__name__: getattr(role(), name)
            for role in ROLES
            if name in names(role) and not issubclass(role, tuple(changed.get(name, ())))
        }
        assert len(set(defaults.values())) == 1, (name, defaults)
    assert NodeSettings().tune_inflight is True and WorkerSettings().tune_inflight is False
    shared = [name for name in declared if sum(name in names(role) for role in ROLES) > 1]
    assert {"lease_seconds", "progress_seconds", "gpu_hour_usd", "max_inflight"} <= set(shared)


@pytest.mark.parametrize(
    ("role", "overrides", "unknown"),
    [
        (ProducerSettings, {"max_inflight": 3}, "max_inflight"),
        (ProducerSettings, {"queue": "q", "max_inflight": None}, "max_inflight"),  # even when None
        (CommonSettings, {"gpu_hour_usd": 1.0}, "gpu_hour_usd"),
        (WorkerSettings, {"gpus": "0-3"}, "gpus"),
        (NodeSettings, {"max_inflite": 3}, "max_inflite"),
        (MonitorSettings, {"endpoint": "http://x"}, "endpoint"),
    ],
)
def test_an_unknown_override_is_a_config_error_naming_it(
    role: type[CommonSettings], overrides: dict[str, Any], unknown: str
) -> None:
    with pytest.raises(ConfigError) as info:
        role.load({}, **overrides)
    assert repr(unknown) in str(info.value) and role.__name__ in str(info.value)
    with pytest.raises(ConfigError, match=unknown):
        role().replace(**overrides)


@pytest.mark.parametrize(
    ("role", "changes", "fragment"),
    [
        (CommonSettings, {"queue": "a,b"}, "queue must be a name without commas or spaces"),
        (CommonSettings, {"lease_seconds": 0.0}, "lease_seconds must be > 0, got 0.0"),
        (CommonSettings, {"visibility_timeout": 60}, "visibility_timeout must exceed lease_seconds"),
        (ProducerSettings, {"progress_seconds": 0.0}, "progress_seconds must be > 0, got 0.0"),
        (ProducerSettings, {"repair_rounds": -1}, "repair_rounds must be >= 0, got -1"),
        (ProducerSettings, {"repair_spacing_seconds": -1.0}, "repair_spacing_seconds must be >= 0"),
        (MonitorSettings, {"gpu_hour_usd": -1.0}, "gpu_hour_usd must be >= 0, got -1.0"),
        (WorkerSettings, {"metrics_port": 70000}, "metrics_port must be 0 (off) or a TCP port"),
        (NodeSettings, {"port_base": 0}, "port_base must be a TCP port (1-65535), got 0"),
        (NodeSettings, {"max_chunks": 0}, "max_chunks must be >= 1, got 0"),  # a worker's check
        (NodeSettings, {"broker_url": "amqp://x//"}, "broker_url must be a redis:// URL"),  # the base's
    ],
)
def test_each_class_checks_its_own_fields_and_its_bases(
    role: type[CommonSettings], changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        role().replace(**changes)
    assert fragment in str(info.value)
    with pytest.raises(ConfigError):
        role.load({}, **changes)


def test_the_load_of_a_role_returns_that_role() -> None:
    node = NodeSettings.load({}, gpus="0-1")
    assert type(node) is NodeSettings and type(node.replace(max_inflight=2)) is NodeSettings
    assert node.low_water() == 24


@pytest.mark.parametrize("raw", ["auto", " AUTO "])
def test_the_max_inflight_variable_takes_auto_as_the_flag_does(raw: str) -> None:
    settings = WorkerSettings.load({"DFLASH_MAX_INFLIGHT": raw, "DFLASH_TUNE_INFLIGHT": "0"})
    flag = WorkerSettings.load({}, **inflight_overrides(parse_inflight(raw)))
    assert settings.tune_inflight and flag.tune_inflight
    assert settings.max_inflight == flag.max_inflight == DEFAULT_MAX_INFLIGHT


def test_a_number_in_the_max_inflight_variable_leaves_the_tuner_to_its_own_variable() -> None:
    tuned = WorkerSettings.load({"DFLASH_MAX_INFLIGHT": "32", "DFLASH_TUNE_INFLIGHT": "1"})
    assert tuned.max_inflight == 32 and tuned.tune_inflight
    with pytest.raises(ConfigError, match=r"DFLASH_MAX_INFLIGHT='lots' is not a valid int"):
        WorkerSettings.load({"DFLASH_MAX_INFLIGHT": "lots"})


@pytest.mark.parametrize(
    ("raw", "expected"), [("horizon", "horizon"), (" Horizon ", "horizon"), ("8192", 8192), ("1", 1)]
)
def test_the_max_tokens_variable_takes_what_the_enqueue_flag_takes(raw: str, expected: int | str) -> None:
    from dflash_tasks.producer.enqueue_args import build_parser

    assert ProducerSettings.load({"DFLASH_MAX_TOKENS": raw}).max_tokens == expected
    args = build_parser().parse_args(["--input", "x", "--output", "y", "--max-tokens", raw])
    assert args.max_tokens == expected
    assert ProducerSettings.load({}, max_tokens=args.max_tokens).max_tokens == expected
    assert ProducerSettings.load({}).max_tokens == 4096


@pytest.mark.parametrize("raw", ["0", "-5", "lots", "4096.5", ""])
def test_a_bad_max_tokens_is_refused_by_the_variable_and_the_flag_alike(raw: str) -> None:
    from dflash_tasks.producer.enqueue_args import build_parser

    if raw:  # an empty variable is unset
        with pytest.raises(ConfigError, match=r"DFLASH_MAX_TOKENS=.*expected a number of tokens"):
            ProducerSettings.load({"DFLASH_MAX_TOKENS": raw})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--input", "x", "--output", "y", "--max-tokens", raw])
    with pytest.raises(ConfigError, match="max_tokens"):
        ProducerSettings(max_tokens="8192").validate()  # a number is an int, as the loader makes it


def test_a_number_in_max_inflight_pins_the_node_as_the_flag_does_unless_tuning_is_asked_for() -> None:
    assert NodeSettings.load({}).tune_inflight is True  # the launcher tunes by default
    pinned = NodeSettings.load({"DFLASH_MAX_INFLIGHT": "64"})
    assert (pinned.max_inflight, pinned.tune_inflight) == (64, False)
    started = NodeSettings.load({"DFLASH_MAX_INFLIGHT": "64", "DFLASH_TUNE_INFLIGHT": "1"})
    assert (started.max_inflight, started.tune_inflight) == (64, True)
    assert NodeSettings.load({"DFLASH_MAX_INFLIGHT": "auto"}).tune_inflight is True
    assert WorkerSettings.load({"DFLASH_MAX_INFLIGHT": "64"}).tune_inflight is False
