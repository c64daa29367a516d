"""The node's Prometheus targets (file_sd list), from its plans."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from workers.node.launch import NodeOptions, plan_node
from workers.node.scrape_targets import scrape_host, target_groups, write_targets


def test_each_gpu_has_its_server_and_worker_labelled_with_role_gpu_and_node(tmp_path: Path) -> None:
    plans = plan_node(NodeOptions(gpus=(0, 2), model_path="", simulate=True, port_base=31000), {})
    groups = target_groups(plans, "node7", 9808, "10.0.0.7")
    assert groups == [
        {"targets": ["10.0.0.7:31000"], "labels": {"node": "node7", "gpu": "gpu0", "role": "sglang"}},
        {"targets": ["10.0.0.7:9808"], "labels": {"node": "node7", "gpu": "gpu0", "role": "worker"}},
        {"targets": ["10.0.0.7:31002"], "labels": {"node": "node7", "gpu": "gpu2", "role": "sglang"}},
        {"targets": ["10.0.0.7:9810"], "labels": {"node": "node7", "gpu": "gpu2", "role": "worker"}},
    ]
    # metrics off (port 0): only the servers
    assert {g["labels"]["role"] for g in target_groups(plans, "n", 0, "h")} == {"sglang"}
    path = tmp_path / "sd" / "node7.json"
    write_targets(path, groups)
    assert json.loads(path.read_text()) == groups
    assert [p.name for p in path.parent.iterdir()] == ["node7.json"]  # no temporary file left


def test_the_scrape_host() -> None:
    assert scrape_host("127.0.0.1") == "127.0.0.1"
    assert scrape_host("0.0.0.0") == socket.gethostname()
    assert scrape_host("0.0.0.0", "gpu-node-3") == "gpu-node-3"
