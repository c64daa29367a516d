"""Generating samples: a sample's turns in order (``conversation``), what the bound server serves
(``identity``), and how a continued thought opens (``thought_opener``)."""
