"""docs/configuration.md is generated from the settings classes: it must be current, and cover every
field and every role."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from dflash_tasks.core.settings import ROLES
from tests.helpers import REPO


def test_configuration_page_is_current() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/config_doc.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_every_setting_is_documented_on_the_page() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    for role in ROLES:
        assert f"## `{role.__name__}`" in page
        for command in role.COMMANDS:
            assert f"`{command}`" in page
        for field in dataclasses.fields(role):
            assert page.count(f"| `DFLASH_{field.name.upper()}` |") == 1  # one row, under its class
    assert "(undocumented)" not in page
