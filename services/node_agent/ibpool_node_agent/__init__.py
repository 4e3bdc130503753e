"""The ibpool node agent."""
