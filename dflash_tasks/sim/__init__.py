"""An SGLang-compatible HTTP simulator for development, tests, demos and benchmarks (no GPU).

Run it as ``python -m dflash_tasks.sim --port 30000`` or in-process::

    from dflash_tasks.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(port=0, time_scale=0.001)) as sim:
        requests.post(f"{sim.url}/v1/chat/completions", json={...})
"""

from dflash_tasks.sim.config import FAULT_KINDS, FaultSpec, SimConfig
from dflash_tasks.sim.engine import SimEngine
from dflash_tasks.sim.server import RunningSimulator, start_simulator

__all__ = ["FAULT_KINDS", "FaultSpec", "RunningSimulator", "SimConfig", "SimEngine", "start_simulator"]
