"""The commands' one convention: their names, shared flags and how a flag reaches the settings."""
