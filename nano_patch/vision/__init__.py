"""Accelerated image kernels: JPEG decode (``decode``), array transforms (``functional``), Compose (``pipeline``)."""
