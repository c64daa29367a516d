"""Run inside the SGLang environment with SpecForge on ``PYTHONPATH`` (no dflash_tasks here).

``python specforge_count.py REQUEST.json`` reads ``{"tokenizer", "template", "max_length",
"rows": [{"conversations", "last_turn_only"}]}`` and prints one JSON list: each row's loss-mask
sum from SpecForge's ``preprocess_conversations`` with its registered template, as its trainer
computes it.
"""

import json
import sys

from specforge.data.preprocessing import preprocess_conversations
from specforge.data.template import TEMPLATE_REGISTRY
from transformers import AutoTokenizer


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        request = json.load(fh)
    tokenizer = AutoTokenizer.from_pretrained(request["tokenizer"], local_files_only=True)
    template = TEMPLATE_REGISTRY.get(request["template"])
    sums = []
    for row in request["rows"]:
        out = preprocess_conversations(
            tokenizer,
            [row["conversations"]],
            template,
            max_length=request["max_length"],
            train_only_last_turn=row["last_turn_only"],
        )
        sums.append(int(out["loss_mask"][0].sum()))
    print(json.dumps(sums))


if __name__ == "__main__":
    main()
