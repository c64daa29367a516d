"""Watching a run: metrics, the progress snapshot and progress.json, the progress bar, status, Flower."""
