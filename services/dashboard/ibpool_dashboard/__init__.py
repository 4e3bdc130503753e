"""ibpool web dashboard."""
