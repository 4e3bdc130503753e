"""The `ibpool` command."""
