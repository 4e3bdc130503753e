"""Slurm through its own commands: `scontrol` run as a child with the configured SLURM_CONF."""

from __future__ import annotations

import asyncio
import os

from ibpool_core.slurm_bridge import SlurmNode, parse_scontrol_nodes

from .config import SlurmBridgeConfig


class ScontrolFailed(Exception):
    """scontrol exited non-zero, printed an error, timed out or could not run; the message says which."""


class Scontrol:
    def __init__(self, cfg: SlurmBridgeConfig) -> None:
        self.program = cfg.scontrol
        self.timeout_s = cfg.scontrol_timeout_s
        self.env = {**os.environ, **({"SLURM_CONF": cfg.slurm_conf} if cfg.slurm_conf else {})}

    async def run(self, *args: str) -> str:
        """`scontrol ARGS`'s output; ScontrolFailed with scontrol's own words when it fails."""
        what = f"scontrol {' '.join(args)}"
        try:
            proc = await asyncio.create_subprocess_exec(
                self.program,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
            )
        except OSError as e:
            raise ScontrolFailed(f"{what}: cannot run {self.program!r}: {e}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ScontrolFailed(f"{what}: no answer within {self.timeout_s} s") from None
        error = err.decode(errors="replace").strip()
        # scontrol exits 0 on some refusals and says so on stderr ("scontrol: error: ...")
        if proc.returncode != 0 or error.startswith(("scontrol: error", "scontrol: fatal", "slurm_")):
            raise ScontrolFailed(f"{what}: exit {proc.returncode}: {error or out.decode(errors='replace').strip()}")
        return out.decode(errors="replace")

    async def nodes(self) -> dict[str, SlurmNode]:
        """Slurm's nodes as `scontrol show node --details --oneliner` shows them."""
        text = await self.run("show", "node", "--details", "--oneliner")
        try:
            return parse_scontrol_nodes(text)
        except ValueError as e:
            raise ScontrolFailed(str(e)) from None
