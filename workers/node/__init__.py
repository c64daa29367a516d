"""The node: one SGLang server and one bound worker per GPU, started, watched and stopped together."""
