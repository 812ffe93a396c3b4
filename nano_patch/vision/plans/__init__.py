"""The plans: a Compose's plan, its steps and their stock draws, the draw program, the typed ops and their runner, the
tensor tail."""
