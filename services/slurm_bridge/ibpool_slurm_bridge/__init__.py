"""ibpool's Slurm bridge: Slurm's topology.conf and node drains follow ibpool's fabric and health verdicts."""
