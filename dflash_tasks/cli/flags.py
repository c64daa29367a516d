"""The flags every command spells one way, as argparse parent parsers, and the road from a flag
to the settings.

A flag that sets a setting has the setting's field name as its ``dest`` and parses its text as
the setting's ``DFLASH_*`` variable does (:meth:`CommonSettings.parse`), so a flag and its
variable accept the same values; :func:`load_settings` hands every such flag given to the
role's loader. An old spelling stays as a hidden alias (:func:`add_alias`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, TypeVar

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.setting_values import ENV_PREFIX, inflight_overrides
from dflash_tasks.core.settings import CommonSettings, ProgressSettings

Role = TypeVar("Role", bound=CommonSettings)

OUTPUT_HELP = "the job's output root: a directory or s3://bucket/prefix (as given to enqueue)"


class SettingType:
    """An argparse ``type`` parsing a flag's text as ``role``'s setting ``field`` (as its variable)."""

    def __init__(self, role: type[CommonSettings], field: str) -> None:
        self.role, self.field = role, field
        self.__name__ = field  # argparse names a type in some of its messages

    def __call__(self, raw: str) -> Any:
        try:
            return self.role.parse(self.field, raw)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def add_setting(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    role: type[CommonSettings],
    field: str,
    help: str,
    *,
    aliases: Sequence[str] = (),
    **kwargs: Any,
) -> argparse.Action:
    """``flag`` for ``role``'s setting ``field``; its help names the variable read without it.
    ``aliases``: old spellings, accepted and not shown."""
    action = parser.add_argument(
        flag,
        dest=field,
        type=SettingType(role, field),
        help=f"{help} [{ENV_PREFIX}{field.upper()}]",
        **kwargs,
    )
    for alias in aliases:
        add_alias(parser, alias, flag, field, type=action.type)
    return action


class _Alias(argparse.Action):
    """An old spelling of a flag: accepted, hidden from ``--help``; says which spelling is current."""

    def __init__(self, *args: Any, current: str, warn: bool, **kwargs: Any) -> None:
        self.current, self.warn = current, warn
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if self.warn:
            print(f"warning: {option_string} is deprecated; use {self.current}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_alias(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    old: str,
    current: str,
    dest: str,
    *,
    warn: bool = False,
    **kwargs: Any,
) -> None:
    """Accept ``old`` for ``current`` (same ``dest``), hidden; ``warn``: say it is deprecated."""
    parser.add_argument(
        old,
        dest=dest,
        action=_Alias,
        current=current,
        warn=warn,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
        **kwargs,
    )


# --- the parent parsers ------------------------------------------------------------------------


def store_flags(*, output: bool = True, output_help: str = OUTPUT_HELP) -> argparse.ArgumentParser:
    """``--output`` (the job's root; ``output`` False: a worker finds it in each task) and
    ``--s3-endpoint-url``: every command that reads a job's store."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("the store")
    if output:
        g.add_argument("--output", required=True, help=output_help)
    add_setting(
        g,
        "--s3-endpoint-url",
        CommonSettings,
        "s3_endpoint_url",
        "S3-compatible endpoint for s3:// outputs and inputs (MinIO, R2, Ceph)",
        metavar="URL",
    )
    return p


def broker_flags(*, queue: bool = True) -> argparse.ArgumentParser:
    """``--broker-url`` and (``queue``) ``--queue``: every command that talks to Redis."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("the broker")
    add_setting(g, "--broker-url", CommonSettings, "broker_url", "Redis URL", metavar="URL")
    if queue:
        add_setting(
            g,
            "--queue",
            CommonSettings,
            "queue",
            "base queue name; a model's chunks go to <queue>.<model key>",
            metavar="NAME",
        )
    return p


def json_flag(help: str) -> argparse.ArgumentParser:
    """``--json``: the command's result as JSON on stdout (``help`` says which)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help=help)
    return p


def price_flag() -> argparse.ArgumentParser:
    """``--gpu-hour-usd``: the price of one GPU-hour, for costs (over the job's recorded one)."""
    p = argparse.ArgumentParser(add_help=False)
    add_setting(
        p, "--gpu-hour-usd", ProgressSettings, "gpu_hour_usd", "price of one GPU-hour (USD)", metavar="X"
    )
    return p


# --- from the flags to the settings -------------------------------------------------------------


def setting_values(role: type[CommonSettings], args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``role`` that ``args`` gives (a flag's ``dest`` is its field), as overrides
    for ``role.load``; ``--max-inflight`` as :func:`inflight_overrides` reads it."""
    values = {f.name: getattr(args, f.name) for f in fields(role) if getattr(args, f.name, None) is not None}
    if "max_inflight" in values:
        values.update(inflight_overrides(values.pop("max_inflight")))
    return values


def load_settings(role: type[Role], args: argparse.Namespace) -> Role:
    """``role``'s settings: ``DFLASH_*`` variables, with the flags ``args`` gives on top."""
    return role.load(**setting_values(role, args))


def job_flags() -> list[argparse.ArgumentParser]:
    """The flags that find a job and its live figures: its store, Redis and the price (``status``
    and the job's page read the same sources)."""
    return [store_flags(), broker_flags(), price_flag()]
