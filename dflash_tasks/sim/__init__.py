"""An SGLang-compatible HTTP simulator for development, tests, demos and benchmarks (no GPU).

It answers like SGLang 0.5.23 with ``--reasoning-parser qwen3`` and EAGLE/MTP speculative decoding
(see ``docs/sglang.md``): ``POST /v1/chat/completions`` (non-stream, with per-request
``meta_info`` when asked, or streamed: :mod:`dflash_tasks.sim.streaming`), ``GET /health``,
``/health_generate``, ``/ready``, ``/server_info``, ``/model_info`` (and the deprecated
``/get_server_info``, ``/get_model_info``), ``/v1/models`` and ``/metrics``; ``--api-key`` is
enforced as SGLang does. Output lengths are lognormal and deterministic per ``(--seed, prompt)``,
and so is each request's accept length; each request holds one of ``--max-running-requests``
slots for ``completion_tokens / --tokens-per-second * --time-scale`` seconds, later ones wait in
FIFO order. ``--loop-share`` makes a share of the samples loop until ``max_tokens``
(:mod:`dflash_tasks.sim.textgen`).
Start-up: the port refuses connections for ``--load-seconds``, then ``/health`` answers 503 for
``--startup-seconds`` (chat is served meanwhile), then 200.

Simulator-only endpoints:

* ``POST /sim/faults`` ``{"kind": K, "count": N | "seconds": S, "hang_seconds": H}`` with K in
  ``http_500 http_503 hang bad_json abort reset unhealthy``; ``{"kind": "clear"}`` removes all.
  ``GET /sim/faults`` lists the active ones.
* ``GET /sim/stats`` (counters, live counts, peak and time-weighted mean running, occupancy) and
  ``POST /sim/stats/reset`` (which also clears the request log).
* ``GET /sim/requests``: requests received and generated per sample, the wasted ones (generated
  beyond one per sample) and the newest request bodies without their messages; and
  ``--record-requests PATH``, which appends every chat request body to a JSONL file, so tests can
  check exactly what a client sent. One request log serves both (:mod:`dflash_tasks.sim.requestlog`).

Thinking follows Qwen3's chat template and SGLang's ``qwen3`` reasoning parser: only
``chat_template_kwargs.enable_thinking`` set to ``false`` turns it off (a short answer, no
``reasoning_content``); a missing flag (or no ``chat_template_kwargs``) means thinking on, as the
template's ``enable_thinking is defined and enable_thinking is false`` test defaults it.
``--ignore-thinking-flag`` plays a misconfigured server that never reasons.

Run it as ``python -m dflash_tasks.sim --port 30000`` (prints ``SIM READY http://HOST:PORT``) or
in-process::

    from dflash_tasks.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(port=0, time_scale=0.001)) as sim:
        requests.post(f"{sim.url}/v1/chat/completions", json={...})
"""

from dflash_tasks.sim.config import FAULT_KINDS, FaultSpec, SimConfig
from dflash_tasks.sim.engine import SimEngine
from dflash_tasks.sim.server import RunningSimulator, start_simulator

__all__ = ["FAULT_KINDS", "FaultSpec", "RunningSimulator", "SimConfig", "SimEngine", "start_simulator"]
