"""ibpool autoscaler: inference deployments kept at the replica count their load needs."""
