"""ibpool failover controller: health verdicts and the cordons, drains and requeues they cause."""
