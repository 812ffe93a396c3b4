"""DataLoader helpers: worker initialisation and default choices (no patching here)."""
