"""Coordination through Redis: the only code that knows Redis and kombu."""
