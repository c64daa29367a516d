"""docs/configuration.md is generated from Settings: it must be current, and cover every field."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from dflash_tasks.core.settings import Settings
from tests.helpers import REPO


def test_configuration_page_is_current() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/config_doc.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_every_setting_is_documented_on_the_page() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    for field in dataclasses.fields(Settings):
        assert f"`DFLASH_{field.name.upper()}`" in page
    assert "(undocumented)" not in page
