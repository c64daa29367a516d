"""The producer: read and validate the input, stage it, run the preflight, queue the chunks, resume."""
