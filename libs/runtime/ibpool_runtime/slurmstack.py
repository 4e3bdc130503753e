"""A throw-away Slurm on this host, for tests and `ibpool run --slurm`: Debian's `munged`, `slurmctld`
and, for nodes that should be up, one `slurmd` per node, all in a state directory, on free loopback
ports, started as children and stopped by pid.

Every node's slurmd runs in a UTS namespace of its own (`unshare --uts`) whose host name is the
node's name, so one machine holds several Slurm nodes without a Slurm built for multiple slurmd;
each node has its own port. Needs root (munged's key, the namespaces), as CI has.

    with munge(state / "munge") as socket_path:
        with cluster(state / "slurm", socket_path, nodes=["n1", "n2"], topology=text) as slurm:
            slurm.scontrol("show", "topology")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .devstack import _stop_pid, _tail, free_port

# The Debian package that holds each program, for the message when one is missing.
PACKAGES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "unshare": "util-linux",
}


class SlurmError(Exception):
    """The throw-away Slurm could not start or answer; the message says which part and why."""


def binary(name: str) -> str:
    """The path of a Slurm (or munge) program, or SlurmError naming the package that has it."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.is_file()), None
    )
    if found is None:
        raise SlurmError(f"{name} is not installed (Debian package {PACKAGES.get(name, name)})")
    return found


def unavailable(programs: Sequence[str] = tuple(PACKAGES)) -> str:
    """Why a throw-away Slurm cannot run here ("" when it can): programs not installed (with the
    Debian packages that hold them), or not root."""
    gone = missing(programs)
    if gone:
        packages = " ".join(sorted({PACKAGES.get(p, p) for p in gone}))
        return f"{', '.join(gone)} not installed (Debian: apt-get install {packages})"
    if os.geteuid() != 0:
        return "a throw-away Slurm needs root (munged's key, each slurmd's UTS namespace)"
    return ""


def missing(programs: Sequence[str]) -> list[str]:
    """Which of `programs` are not installed."""
    out = []
    for p in programs:
        try:
            binary(p)
        except SlurmError:
            out.append(p)
    return out


def _wait(check: object, timeout_s: float, what: str, pid: int | None, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid is not None and not _alive(pid):
            raise SlurmError(f"{what} exited while starting; see {log}:\n{_tail(log, 25)}")
        if callable(check) and check():
            return
        time.sleep(0.05)
    raise SlurmError(f"{what} did not come up within {timeout_s}s; see {log}:\n{_tail(log, 25)}")


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done = 0  # not our child: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return done == 0


@contextlib.contextmanager
def munge(folder: Path) -> Iterator[Path]:
    """munged with a fresh key in `folder`; yields its socket's path."""
    folder.mkdir(parents=True, exist_ok=True)
    # munged wants the socket's folder reachable by everyone and the key readable by its owner only
    folder.chmod(0o755)
    key = folder / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = folder / "munge.socket"
    log = folder / "munged.log"
    args = [
        binary("munged"),
        "--foreground",
        "--force",
        f"--socket={socket_path}",
        f"--key-file={key}",
        f"--log-file={log}",
        f"--pid-file={folder / 'munged.pid'}",
        f"--seed-file={folder / 'munged.seed'}",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("ab"), stdin=subprocess.DEVNULL)
    try:
        _wait(socket_path.exists, 15, "munged", proc.pid, log)
        yield socket_path
    finally:
        _stop_pid(proc.pid)
        with contextlib.suppress(ChildProcessError):
            proc.wait(timeout=5)


@dataclass
class Cluster:
    """A running throw-away Slurm: its slurm.conf, and scontrol/sinfo with that configuration."""

    folder: Path
    conf: Path
    slurmctld_pid: int
    slurmd_pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def log(self) -> Path:
        return self.folder / "slurmctld.log"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def run(self, program: str, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [binary(program), *args], capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False
        )

    def scontrol(self, *args: str, timeout_s: float = 30) -> str:
        """`scontrol ARGS` against this cluster; SlurmError with scontrol's words when it fails."""
        r = self.run("scontrol", *args, timeout_s=timeout_s)
        if r.returncode != 0 or r.stderr.strip().startswith(("scontrol: error", "scontrol: fatal")):
            raise SlurmError(f"scontrol {' '.join(args)}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def up(self) -> bool:
        r = self.run("scontrol", "ping", timeout_s=10)
        return r.returncode == 0 and "is UP" in r.stdout

    def kill_slurmd(self, node: str) -> None:
        _stop_pid(self.slurmd_pids.pop(node))


def conf_text(
    folder: Path,
    munge_socket: Path,
    nodes: Sequence[str],
    *,
    controller_port: int,
    node_ports: Mapping[str, int],
    topology: bool,
    spool: Path,
    node_line: str = "CPUs=2 RealMemory=100",
    gpus_per_node: int = 0,
) -> str:
    """slurm.conf of a throw-away cluster: every node on 127.0.0.1 (at its own port when it has one),
    with `gpus_per_node` GPUs as a count-only GRES (gres.conf beside it) when > 0."""
    if gpus_per_node:
        node_line += f" Gres=gpu:{gpus_per_node}"
    lines = [
        "ClusterName=ibpool",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={spool}/%n",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd'}-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "SlurmdTimeout=300",
        f"TopologyPlugin=topology/{'tree' if topology else 'none'}",
        *(["GresTypes=gpu"] if gpus_per_node else []),
    ]
    for n in nodes:
        port = f" Port={node_ports[n]}" if n in node_ports else ""
        lines.append(f"NodeName={n} NodeAddr=127.0.0.1{port} {node_line} State=UNKNOWN")
    lines.append("PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def cluster(
    folder: Path,
    munge_socket: Path,
    nodes: Sequence[str],
    *,
    topology: str | None = None,
    slurmd: Sequence[str] = (),
    gpus_per_node: int = 0,
    timeout_s: float = 60,
) -> Iterator[Cluster]:
    """slurmctld for `nodes` (with `topology` as its topology.conf, tree plugin), and a slurmd for each
    node of `slurmd`; `gpus_per_node` GPUs on each node as a GRES Slurm jobs can ask for
    (`--gres=gpu:N`; a count, no devices). SlurmError when slurmctld does not come up (its log's
    tail in the message)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state").mkdir(exist_ok=True)
    # slurmd's spool holds Unix sockets, whose paths may not pass 108 bytes: a short folder of its own
    spool = Path(tempfile.mkdtemp(prefix="ibpool-slurmd-"))
    controller_port = free_port()
    node_ports = {n: free_port() for n in slurmd}
    conf = folder / "slurm.conf"
    conf.write_text(
        conf_text(
            folder,
            munge_socket,
            nodes,
            controller_port=controller_port,
            node_ports=node_ports,
            topology=topology is not None,
            spool=spool,
            gpus_per_node=gpus_per_node,
        )
    )
    if gpus_per_node:
        # Slurm keeps no GPU without a device file: stand-in files, which nothing opens (CountOnly)
        devices = folder / "gpus"
        devices.mkdir(exist_ok=True)
        for i in range(gpus_per_node):
            (devices / f"gpu{i}").touch()
        (folder / "gres.conf").write_text(f"Name=gpu File={devices}/gpu[0-{gpus_per_node - 1}] Flags=CountOnly\n")
    if topology is not None:
        (folder / "topology.conf").write_text(topology)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    out = folder / "slurmctld.out"
    ctld = subprocess.Popen(
        [binary("slurmctld"), "-D", "-i", "-f", str(conf)],
        stdout=out.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    running = Cluster(folder=folder, conf=conf, slurmctld_pid=ctld.pid)
    try:
        _wait(running.up, timeout_s, "slurmctld", ctld.pid, out)
        for n in slurmd:
            (spool / n).mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(
                [
                    binary("unshare"),
                    "--uts",
                    "sh",
                    "-c",
                    'hostname "$1" && exec "$2" -D -f "$3"',
                    "-",
                    n,
                    binary("slurmd"),
                    str(conf),
                ],
                stdout=(folder / f"slurmd-{n}.out").open("ab"),
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
            running.slurmd_pids[n] = proc.pid
        yield running
    finally:
        for pid in running.slurmd_pids.values():
            _stop_pid(pid)
        _stop_pid(ctld.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ctld.pid, 0)
        shutil.rmtree(spool, ignore_errors=True)
