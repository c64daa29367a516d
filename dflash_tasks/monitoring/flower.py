"""``python -m dflash_tasks.flower``: Flower for the dflash queue, on loopback, behind basic auth.

Runs ``celery -A dflash_tasks.coord.celery_app flower`` (same broker settings as the workers) in place
of this process. The user is ``admin`` (``--user``); the password comes from
``DFLASH_FLOWER_PASSWORD``, else one is generated and printed once. It reaches Flower through
the ``FLOWER_BASIC_AUTH`` environment variable, never the command line (``ps`` shows argv), and
the broker URL (which may hold Redis's password) travels the same way.

Flower serves ``/metrics`` and ``/healthcheck`` without authentication: keep it on 127.0.0.1
(the default) and reach it through an SSH tunnel or an authenticating proxy.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import sys

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import add_setting, broker_flags, load_settings
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.setting_values import redact_url
from dflash_tasks.core.settings import MonitorSettings

FLOWER_USER = "admin"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("dflash_tasks.flower"), description=__doc__.splitlines()[0], parents=[broker_flags()]
    )
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5555, help="port (default 5555)")
    p.add_argument("--user", default=FLOWER_USER, help=f"basic-auth user (default {FLOWER_USER})")
    add_setting(
        p, "--max-tasks", MonitorSettings, "flower_max_tasks", "tasks Flower keeps in memory (default 20000)"
    )
    add_setting(
        p,
        "--purge-offline-seconds",
        MonitorSettings,
        "flower_purge_offline_seconds",
        "forget workers offline this long (default 600)",
        aliases=["--purge-offline-workers"],
        metavar="SECONDS",
    )
    return p


def flower_command(
    args: argparse.Namespace, settings: MonitorSettings, base_env: dict[str, str]
) -> tuple[list[str], dict[str, str], str, bool]:
    """(argv, env, password, generated): what to exec. No secret ends up in argv."""
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be a TCP port, got {args.port}")
    if not args.user or ":" in args.user:
        raise ConfigError("--user must be non-empty and contain no ':'")
    password = settings.flower_password or secrets.token_urlsafe(16)
    env = {k: v for k, v in base_env.items() if k != "DFLASH_FLOWER_PASSWORD"}
    env.update(
        FLOWER_BASIC_AUTH=f"{args.user}:{password}",
        DFLASH_BROKER_URL=settings.broker_url,
        DFLASH_QUEUE=settings.queue,
    )
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "dflash_tasks.coord.celery_app",
        "flower",
        f"--address={args.address}",
        f"--port={args.port}",
        f"--max_tasks={settings.flower_max_tasks}",
        f"--purge_offline_workers={settings.flower_purge_offline_seconds}",
    ]
    return argv, env, password, not settings.flower_password


def is_loopback(address: str) -> bool:
    """Whether binding ``address`` keeps a server on this machine."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(MonitorSettings, args)
        command, env, password, generated = flower_command(args, settings, dict(os.environ))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    where = f"http://{args.address}:{args.port}"
    print(f"Flower at {where} (broker {redact_url(settings.broker_url)}), user {args.user}", file=sys.stderr)
    if generated:
        print(
            f"generated password (shown once; set DFLASH_FLOWER_PASSWORD to choose one): {password}",
            file=sys.stderr,
        )
    if not is_loopback(args.address):
        print(
            f"warning: binding {args.address}: Flower's /metrics and /healthcheck need no password",
            file=sys.stderr,
        )
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return ExitCode.OK  # not reached


if __name__ == "__main__":
    sys.exit(main())
