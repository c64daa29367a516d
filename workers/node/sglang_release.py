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
#: The official image of that release: CUDA 13 only, an R580+ driver (SGLang's CUDA 12 images
#: stopped at v0.5.19-cu129; docs/deploy.md says what a CUDA 12 driver needs).
SGLANG_IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}"
#: SGLang's last CUDA 12 image (0.5.20 and later are CUDA 13 only): named by the docs, never run.
LAST_CUDA12_IMAGE = "lmsysorg/sglang:v0.5.19-cu129"
