"""config.json contents of the model families the node launcher tells apart (trimmed to what
matters: architectures and MTP layer counts, where each family keeps them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Qwen3.6-27B-style (the seed): a multimodal wrapper whose language model, with its MTP layer,
#: is described in ``text_config``.
QWEN36_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
    },
    "vision_config": {"depth": 27},
}

#: DeepSeek-V3: the NextN layer count at the top level.
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
}

#: Qwen3-8B: dense, no MTP head in any SGLang release.
QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_hidden_layers": 36,
}

#: Qwen3-30B-A3B: an architecture SGLang can give an MTP draft, in a checkpoint without MTP layers.
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_hidden_layers": 48,
}


def write_model(root: Path, name: str, config: dict[str, Any]) -> Path:
    """A model directory ``root/name`` holding only ``config.json``."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path
