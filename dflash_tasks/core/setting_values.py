"""A setting's text and its value: the one parser that ``DFLASH_*`` variables and the flags of
the same settings both go through (so both accept the same values), and a URL shown without its
password."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import Field, fields
from typing import Any

from dflash_tasks.core.budget import parse_max_tokens
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.on_loop import OnLoop
from dflash_tasks.core.repetition import RepetitionSettings

ENV_PREFIX = "DFLASH_"
#: ``--max-inflight auto`` and ``DFLASH_MAX_INFLIGHT=auto``: the worker tunes its target
#: (``tune_inflight``).
AUTO_INFLIGHT = "auto"
#: ``--echo``: which of the node's logs go to its stdout.
ECHO_LOGS = ("all", "workers", "none")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_value(name: str, kind: Any, raw: str, *, named: bool = True) -> Any:
    """The value of setting ``name`` (declared type ``kind``) written as ``raw``.

    ``max_inflight`` also takes ``auto`` (returned as :data:`AUTO_INFLIGHT`). Raises
    :class:`ConfigError` naming the text and the type, and (``named``) the setting's variable.
    """
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    where = f"{ENV_PREFIX}{name.upper()}=" if named else ""
    if name == "max_inflight" and raw.strip().lower() == AUTO_INFLIGHT:
        return AUTO_INFLIGHT
    if name == "max_tokens":  # a number or "horizon", as --max-tokens takes
        try:
            return parse_max_tokens(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}{raw!r}: {exc}") from None
    if name == "repetition":  # a loop rule, as --repetition takes
        try:
            RepetitionSettings.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}{raw!r}: {exc}") from None
    if name == "on_loop":  # a policy, as --on-loop takes
        try:
            OnLoop.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}{raw!r}: {exc}") from None
    try:
        if kind_name == "int":
            return int(raw)
        if kind_name == "float":
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(raw)
            return value
        if kind_name == "bool":
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError(raw)
    except ValueError:
        where = f"{ENV_PREFIX}{name.upper()}=" if named else ""
        hint = f": a number of requests or {AUTO_INFLIGHT!r}" if name == "max_inflight" else ""
        raise ConfigError(f"{where}{raw!r} is not a valid {kind_name}{hint}") from None
    return raw


def variables_of(settings: Iterable[Field[Any]], source: Mapping[str, str]) -> dict[str, Any]:
    """The values ``source``'s ``DFLASH_*`` variables give these settings, empty ones left out.
    ``DFLASH_MAX_INFLIGHT`` means what ``--max-inflight`` means: ``auto`` turns the tuner on, a
    number pins the target unless ``DFLASH_TUNE_INFLIGHT`` is given too (then the tuner starts there)."""
    values: dict[str, Any] = {}
    for setting in settings:
        raw = source.get(ENV_PREFIX + setting.name.upper())
        if raw is not None and raw != "":
            values[setting.name] = parse_value(setting.name, setting.type, raw)
    if values.get("max_inflight") == AUTO_INFLIGHT:
        del values["max_inflight"]
        values.update(inflight_overrides(AUTO_INFLIGHT))
    elif "max_inflight" in values and "tune_inflight" not in values:
        values.update(inflight_overrides(values["max_inflight"]))
    return values


def parse_inflight(text: str) -> int | str:
    """A ``--max-inflight`` value: a number of requests, or ``auto``; raises ``ValueError`` otherwise
    (argparse shows its message)."""
    if text.strip().lower() == AUTO_INFLIGHT:
        return AUTO_INFLIGHT
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected a number of requests or {AUTO_INFLIGHT!r}, got {text!r}") from None


def inflight_overrides(value: int | str | None) -> dict[str, Any]:
    """The settings a ``--max-inflight`` value sets: a number pins the target (whatever
    ``DFLASH_TUNE_INFLIGHT`` says), ``auto`` turns the tuner on, None leaves both to the environment."""
    if value is None:
        return {}
    if value == AUTO_INFLIGHT:
        return {"tune_inflight": True}
    return {"max_inflight": value, "tune_inflight": False}


def check_positive(settings: object, *names: str) -> None:
    """Raise :class:`ConfigError` naming the first of ``names`` whose value is not above 0."""
    for name in names:
        if not getattr(settings, name) > 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(settings, name)}")


def check_at_least(settings: object, low: int, *names: str) -> None:
    """Raise :class:`ConfigError` naming the first of ``names`` whose value is below ``low``."""
    for name in names:
        if not getattr(settings, name) >= low:
            raise ConfigError(f"{name} must be >= {low}, got {getattr(settings, name)}")


def check_max_tokens(value: int | str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is what ``--max-tokens`` takes, parsed."""
    try:
        parsed = parse_max_tokens(value)
    except ConfigError as exc:
        raise ConfigError(f"max_tokens: {exc}") from None
    if parsed != value:
        raise ConfigError(f"max_tokens must be an int or {parsed!r}, got {value!r}")


def check_repetition(value: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a loop-detection setting (``--repetition``)."""
    try:
        RepetitionSettings.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}REPETITION={value!r}: {exc}") from None


def check_on_loop(value: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a looped-sample policy (``--on-loop``)."""
    try:
        OnLoop.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}ON_LOOP={value!r}: {exc}") from None


def check_names(cls: type, given: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming the keys of ``given`` that are no field of ``cls``."""
    known = {f.name for f in fields(cls)}
    unknown = [name for name in given if name not in known]
    if unknown:
        raise ConfigError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}")


def is_user_password(value: str) -> bool:
    """Whether ``value`` reads ``user:password``, both non-empty."""
    user, sep, password = value.partition(":")
    return bool(user and sep and password)


def redact_url(url: str) -> str:
    """``url`` with any password (userinfo or ``?password=``) replaced by ``***``, for logs and messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        rest = f"{user}:***@{host}" if ":" in creds else f"{creds}@{host}"
    rest = _QUERY_PASSWORD.sub(r"\1***", rest)
    return f"{scheme}://{rest}" if sep else rest


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)
