"""The ibpool fabric monitor."""
