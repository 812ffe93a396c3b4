"""Accelerated image kernels: JPEG decode (``decode``), array transforms (``functional``), the
Compose (``compose_call``, ``compose_plan``)."""
