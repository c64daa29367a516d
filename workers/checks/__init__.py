"""What the worker learns from the records it stores: their loss tokens, counted with the served
model's tokenizer (``loss_counting``), and the live quality gate (``live_gate``)."""
