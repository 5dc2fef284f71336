"""Subcommands of ``tpu-ops``: each module exposes ``register(sub)`` and sets ``handler``."""
