"""The one SGLang release this project launches and tests against.

Everything that installs or pulls SGLang names this release: ``deploy/install.sh`` (which
reads :data:`SGLANG_PIP_SPEC` from this file), the compose image tag, ``deploy/env.example``,
the README's launch line and ``docs/deploy.md``. ``tests/deploy/test_sglang_release.py``
checks each of them against these constants, and checks every flag we launch with against
this release's own CLI (read from its wheel). To move to another release, change
:data:`SGLANG_VERSION`, run the tests, and fix what they name.
"""

from __future__ import annotations

#: The pinned SGLang release: the newest that serves Qwen3.5/3.6 with MTP when it was pinned.
SGLANG_VERSION = "0.5.23"
#: What ``pip install`` gets (deploy/install.sh).
SGLANG_PIP_SPEC = f"sglang=={SGLANG_VERSION}"
#: The official image of that release (CUDA 13 build; ``-cu129`` for CUDA 12 drivers).
SGLANG_IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}"
