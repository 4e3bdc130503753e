"""ibpool_sim: trace loaders (and, as it grows, the discrete-event cluster simulator)."""
