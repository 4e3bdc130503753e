"""The whole system in containers for one chaos scenario, started with testcontainers.

Every scenario gets its own docker network and containers named `chaos-<run>-<part>`, so several
runs never meet. The parts: a 3-node NATS JetStream cluster (R3 streams, `sync_interval: always`,
as in compose.yaml but without TLS and users: the bus's security has its own tests), Postgres, the
fabric monitor, the pool allocator, two scheduler replicas (leader election and fencing), the
failover controller, the autoscaler, and node agents of simulated nodes. The test process reaches
them only through ports published on loopback, fixed at start so that a restarted container keeps
them.

The bus is secured as in compose.yaml: clients and routes over TLS (a CA made per scenario with
deploy/tls/make-certs.sh), one NATS user per service with only its own permissions and one per node
agent allowed only its own nodes (deploy/nats/make-auth.sh with an agents.json), the failover
controller reading connection advisories as the `system` user, and grants signed by the allocator.
The test process reads as `admin` (`System.access`), the outside subscriber as `subscriber`.

Parts are named by role (`nats-2`, `scheduler-1`, `agent-3`); the fault timeline may also name a
role that is resolved when the fault fires: `scheduler-leader` (the replica that says it leads) and
`stream-leader` (the NATS node leading the pool stream's RAFT group). A symbolic role keeps the
container it resolved to for the rest of the scenario, so `pause` and `unpause` hit the same one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from ibpool_runtime.bus_permissions import AgentGrant, agent_grant
from ibpool_runtime.devstack import free_port
from ibpool_runtime.grant_signing import new_seed, public_key_of

from .invariants import Access

ROOT = Path(__file__).resolve().parents[2]

IMAGES = (
    "nats",
    "postgres",
    "fabric-monitor",
    "pool-allocator",
    "scheduler",
    "failover-controller",
    "autoscaler",
    "node-agent",
)
NATS_NODES = 3
POSTGRES_PASSWORD = "chaos"
NODE_PREFIX = "chaos"  # the simulated nodes are chaos-001, chaos-002, ...

# One node of the cluster; the server name comes from the environment, the routes name every node.
NATS_CONF = """\
server_name: $NATS_SERVER_NAME
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
jetstream {{
  store_dir: /var/lib/nats
  sync_interval: always
}}
tls {{
  cert_file: /etc/nats/tls/server.pem
  key_file: /etc/nats/tls/server-key.pem
  ca_file: /etc/nats/tls/ca.pem
}}
cluster {{
  name: chaos
  listen: 0.0.0.0:6222
  routes: [{routes}]
  tls {{
    cert_file: /etc/nats/tls/server.pem
    key_file: /etc/nats/tls/server-key.pem
    ca_file: /etc/nats/tls/ca.pem
  }}
}}
include ./auth.conf
"""
# Whose NATS credentials the attacker holds: agent 1's own user.
ATTACKER_HOLDS = "agent-1"
# Where a service container finds the CA its NATS connections verify the servers against.
CA_IN_CONTAINER = "/run/secrets/nats-ca.pem"


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a scenario runs: agents x nodes per agent, and the failover controller's settings."""

    agents: int = 2
    nodes_per_agent: int = 4
    # The simulated GPUs' random ECC errors and XIDs (the node agent's `sim_*_rate`): off where a
    # scenario must tell every failure apart from what it did itself.
    random_gpu_faults: bool = True
    schedulers: int = 2
    # The largest fraction of the cluster the failover controller fails at once (more is ClusterDegraded).
    max_failed_fraction: float = 0.5
    scheduler_lease_s: float = 5.0

    @property
    def nodes(self) -> int:
        return self.agents * self.nodes_per_agent

    def agent_nodes(self, agent: int) -> list[str]:
        """The node ids agent `agent` (1-based) hosts, as the node agent names them."""
        return list(self.agent_grant(agent).nodes)

    def agent_first(self, agent: int) -> int:
        """The number of agent `agent`'s first node."""
        return 1 + (agent - 1) * self.nodes_per_agent

    def agent_grant(self, agent: int) -> AgentGrant:
        """Agent `agent`'s nodes and durable, for its own NATS user."""
        return agent_grant(NODE_PREFIX, self.agent_first(agent), self.nodes_per_agent)


@dataclass
class System:
    layout: Layout
    run: str
    network: Network
    containers: dict[str, DockerContainer] = field(default_factory=dict)
    nats_ports: dict[str, int] = field(default_factory=dict)
    http_ports: dict[str, int] = field(default_factory=dict)
    postgres_port: int = 0
    resolved: dict[str, str] = field(default_factory=dict)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ibpool-chaos-")))
    passwords: dict[str, str] = field(default_factory=dict)  # NATS user -> password

    # --- addresses -------------------------------------------------------------------------------

    def name(self, role: str) -> str:
        return f"chaos-{self.run}-{role}"

    @property
    def secrets(self) -> Path:
        return self.workdir / "secrets"

    @property
    def ca(self) -> Path:
        return self.secrets / "tls" / "ca.pem"

    def access(self, user: str = "admin") -> Access:
        """The NATS cluster as the test process reaches it (loopback, TLS), as `user`."""
        pw = self.passwords[user]
        return Access(tuple(f"tls://{user}:{pw}@127.0.0.1:{p}" for p in self.nats_ports.values()), str(self.ca))

    def _servers(self, user: str) -> str:
        """The NATS cluster as the containers reach it, as `user`."""
        pw = self.passwords[user]
        return ",".join(f"tls://{user}:{pw}@{self.name(f'nats-{i}')}:4222" for i in range(1, NATS_NODES + 1))

    @property
    def scheduler_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for r, p in self.http_ports.items() if r.startswith("scheduler")]

    @property
    def postgres_dsn(self) -> str:
        return f"postgresql://postgres:{POSTGRES_PASSWORD}@127.0.0.1:{self.postgres_port}/postgres"

    def roles(self, prefix: str = "") -> list[str]:
        return [r for r in self.containers if r.startswith(prefix)]

    # --- starting --------------------------------------------------------------------------------

    def _container(self, role: str, image: str, *, read_only: bool = True) -> DockerContainer:
        c = DockerContainer(f"ibpool/{image}:dev").with_name(self.name(role)).with_network(self.network)
        if read_only:
            c = c.with_kwargs(read_only=True).with_tmpfs_mount("/tmp")
        self.containers[role] = c
        return c

    def _publish(self, c: DockerContainer, port: int) -> int:
        host = free_port()
        c.ports[f"{port}/tcp"] = ("127.0.0.1", host)  # type: ignore[assignment]  # loopback only
        return host

    def _service_env(self, c: DockerContainer, user: str) -> DockerContainer:
        """A service on its own NATS user over TLS, and Postgres."""
        return (
            c.with_env("IBPOOL_NATS_URL", self._servers(user))
            .with_env("IBPOOL_NATS_TLS_CA", CA_IN_CONTAINER)
            .with_volume_mapping(self.ca, CA_IN_CONTAINER)
            .with_env(
                "IBPOOL_POSTGRES_DSN",
                f"postgresql://postgres:{POSTGRES_PASSWORD}@{self.name('postgres')}:5432/postgres",
            )
            .with_env("IBPOOL_STREAM_REPLICAS", str(NATS_NODES))
        )

    def make_secrets(self) -> None:
        """Users, passwords and permissions, and the CA and server certificate, by the deployment's
        own scripts (as deploy/compose-secrets.sh runs them)."""
        env = {"PY": sys.executable, "PATH": "/usr/local/bin:/usr/bin:/bin"}
        nats_dir, tls_dir = self.secrets / "nats", self.secrets / "tls"
        # Each agent enrolled with a user of its own, allowed only its nodes (make-auth.sh reads this).
        nats_dir.mkdir(parents=True, exist_ok=True)
        agents = {
            f"agent-{a}": {"nodes": list(g.nodes), "durable": g.durable}
            for a in range(1, self.layout.agents + 1)
            for g in [self.layout.agent_grant(a)]
        }
        (nats_dir / "agents.json").write_text(json.dumps(agents))
        names = [self.name(f"nats-{i}") for i in range(1, NATS_NODES + 1)]
        for cmd in (["deploy/nats/make-auth.sh", str(nats_dir)], ["deploy/tls/make-certs.sh", str(tls_dir), *names]):
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{cmd[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
        self.passwords = {f.stem: f.read_text().strip() for f in nats_dir.glob("*.password")}
        (nats_dir / "auth.conf").chmod(0o644)  # read by nats-server as uid 10001 through a bind mount

    def start_infrastructure(self) -> None:
        self.make_secrets()
        routes = ", ".join(f"nats-route://{self.name(f'nats-{i}')}:6222" for i in range(1, NATS_NODES + 1))
        conf = self.workdir / "nats.conf"
        conf.write_text(NATS_CONF.format(routes=routes))
        conf.chmod(0o644)
        self.workdir.chmod(0o755)
        tls = self.secrets / "tls"
        for i in range(1, NATS_NODES + 1):
            role = f"nats-{i}"
            c = self._container(role, "nats", read_only=False)
            self.nats_ports[role] = self._publish(c, 4222)
            c.with_env("NATS_SERVER_NAME", role).with_volume_mapping(conf, "/etc/nats/nats.conf")
            c.with_volume_mapping(self.secrets / "nats" / "auth.conf", "/etc/nats/auth.conf")
            for f in ("ca.pem", "server.pem", "server-key.pem"):
                c.with_volume_mapping(tls / f, f"/etc/nats/tls/{f}")
            c.with_command(["--config", "/etc/nats/nats.conf"]).start()
        pg = self._container("postgres", "postgres", read_only=False).with_env("POSTGRES_PASSWORD", POSTGRES_PASSWORD)
        self.postgres_port = self._publish(pg, 5432)
        pg.start()

    def start_services(self) -> None:
        """The services and agents; the streams exist already (see `ensure_streams` in the fixture)."""
        lo = self.layout
        # The allocator signs what the agents act on; the agents trust its key only.
        seed = self.workdir / "grant-signing.seed"
        seed.write_text(new_seed() + "\n")
        seed.chmod(0o644)
        signers = json.dumps([public_key_of(seed.read_text().strip())])
        c = self._service_env(self._container("allocator", "pool-allocator"), "pool_allocator")
        c.with_volume_mapping(seed, "/run/secrets/grant-signing.seed")
        c.with_env("IBPOOL_POOL_ALLOCATOR_GRANT_SIGNING_SEED_FILE", "/run/secrets/grant-signing.seed")
        self.http_ports["allocator"] = self._publish(c, 8080)
        c.start()
        for i in range(1, lo.schedulers + 1):
            c = self._service_env(self._container(f"scheduler-{i}", "scheduler"), "scheduler")
            c.with_env("IBPOOL_SCHEDULER_INSTANCE", f"s-{i}").with_env(
                "IBPOOL_SCHEDULER_LEADER_TTL_S", str(lo.scheduler_lease_s)
            )
            self.http_ports[f"scheduler-{i}"] = self._publish(c, 8080)
            c.start()
        c = self._service_env(self._container("fabric-monitor", "fabric-monitor"), "fabric_monitor")
        c.with_env("IBPOOL_FABRIC_MONITOR_PUBLIC_URL", f"http://{self.name('fabric-monitor')}:8080")
        c.start()
        c = self._service_env(self._container("autoscaler", "autoscaler"), "autoscaler")
        c.start()
        c = self._service_env(self._container("failover", "failover-controller"), "failover_controller")
        c.with_env("IBPOOL_FAILOVER_CONTROLLER_STABLE_WINDOW_S", "3")
        c.with_env("IBPOOL_FAILOVER_CONTROLLER_MAX_FAILED_FRACTION", str(lo.max_failed_fraction))
        # Agents' closed connections, from the servers' advisories on the system account.
        c.with_env("IBPOOL_FAILOVER_CONTROLLER_CONNECTION_EVENTS_URL", self._servers("system"))
        self.http_ports["failover"] = self._publish(c, 8080)
        c.start()
        for a in range(1, lo.agents + 1):
            c = self._service_env(self._container(f"agent-{a}", "node-agent"), f"agent-{a}")
            c.with_env("IBPOOL_NODE_AGENT_BACKEND", "simulated").with_env(
                "IBPOOL_NODE_AGENT_NODES", str(lo.nodes_per_agent)
            )
            c.with_env("IBPOOL_NODE_AGENT_FIRST_NODE", str(lo.agent_first(a)))
            c.with_env("IBPOOL_NODE_AGENT_NODE_PREFIX", NODE_PREFIX)
            if not lo.random_gpu_faults:
                c.with_env("IBPOOL_NODE_AGENT_SIM_ECC_RATE", "0").with_env("IBPOOL_NODE_AGENT_SIM_XID_RATE", "0")
            c.with_env("IBPOOL_NODE_AGENT_GRANT_SIGNERS", signers)
            c.start()

    def start_attacker(self, plan_json: str) -> None:
        """The attacker (tests/chaos/attacker.py) in a container of its own on the scenario's network,
        from the node agent's image, holding agent 1's NATS credentials."""
        plan = self.workdir / "attack-plan.json"
        plan.write_text(plan_json)
        plan.chmod(0o644)
        c = self._container("attacker", "node-agent")
        c.with_kwargs(read_only=True, entrypoint=["python", "/attack/attacker.py", "/attack/plan.json"])
        c.with_volume_mapping(ROOT / "tests" / "chaos" / "attacker.py", "/attack/attacker.py")
        c.with_volume_mapping(plan, "/attack/plan.json")
        c.with_volume_mapping(self.ca, CA_IN_CONTAINER)
        c.with_env("ATTACK_NATS_URL", self._servers(ATTACKER_HOLDS)).with_env("ATTACK_NATS_CA", CA_IN_CONTAINER)
        c.start()

    def attacker_report(self, timeout_s: float = 180) -> dict[str, Any]:
        """What the attacker says the servers let it do, once it has finished (then it is removed, so
        that the health of the system's own containers is judged without it)."""
        container = self.containers.pop("attacker")
        wrapped = container.get_wrapped_container()
        status = wrapped.wait(timeout=timeout_s)
        logs = wrapped.logs().decode(errors="replace")
        container.stop()
        lines = [ln for ln in logs.splitlines() if ln.startswith("ATTACK-REPORT ")]
        if status.get("StatusCode") != 0 or not lines:
            raise AssertionError(f"the attacker failed ({status}): {logs[-3000:]}")
        report: dict[str, Any] = json.loads(lines[-1].removeprefix("ATTACK-REPORT "))
        return report

    def stop(self) -> None:
        for c in self.containers.values():
            try:
                c.stop()
            except Exception:
                pass
        try:
            self.network.remove()
        except Exception:
            pass

    # --- faults ----------------------------------------------------------------------------------

    def resolve(self, role: str) -> str:
        """A concrete role for a symbolic one (resolved once per scenario), or the role itself."""
        resolvers = {
            "scheduler-leader": self._scheduler_leader,
            "stream-leader": self._stream_leader,
            "busy-agent": self._busy_agent,
        }
        if role not in resolvers:
            return role
        if role not in self.resolved:
            self.resolved[role] = resolvers[role]()
        return self.resolved[role]

    def _get(self, url: str) -> Any:
        with urllib.request.urlopen(url, timeout=3) as r:
            return json.load(r)

    def _busy_agent(self) -> str:
        """The agent hosting the most GPUs of running jobs now (so that its kill hits work)."""
        load: dict[int, int] = defaultdict(int)
        for url in self.scheduler_urls:
            try:
                jobs = self._get(f"{url}/v1/jobs?state=running,scheduled")
            except OSError:
                continue
            for job in jobs:
                for a in job["assignments"]:
                    load[1 + (int(a["node_id"].rsplit("-", 1)[1]) - 1) // self.layout.nodes_per_agent] += 1
            break
        agent = max(load, key=lambda a: load[a], default=self.layout.agents)
        return f"agent-{agent}"

    def _scheduler_leader(self) -> str:
        for role, port in self.http_ports.items():
            if role.startswith("scheduler") and self._get(f"http://127.0.0.1:{port}/v1/scheduler")["leader"]:
                return role
        raise AssertionError("no scheduler replica says it leads")

    def _stream_leader(self, stream: str = "IBPOOL_POOL") -> str:
        async def leader() -> str:
            nc = await self.access().connect()
            try:
                info = await nc.jetstream().stream_info(stream)
            finally:
                await nc.close()
            assert info.cluster is not None and info.cluster.leader, f"stream {stream} has no cluster leader"
            return str(info.cluster.leader)

        name = asyncio.run(leader())  # called from a worker thread: its own loop
        assert name in self.nats_ports, f"stream leader {name!r} is not one of ours"
        return name

    def act(self, action: str, role: str) -> str:
        """kill (SIGKILL), start, restart, pause/unpause, disconnect/connect (from the scenario's network).
        Returns the concrete role acted on."""
        role = self.resolve(role)
        container = self.containers[role].get_wrapped_container()
        match action:
            case "kill":
                container.kill(signal="SIGKILL")
            case "start":
                container.start()
            case "restart":
                container.restart(timeout=10)
            case "pause":
                container.pause()
            case "unpause":
                container.unpause()
            case "disconnect":
                self.network._unwrap_network.disconnect(container)
            case "connect":
                self.network._unwrap_network.connect(container)
            case _:
                raise ValueError(f"unknown fault action {action!r}")
        return role

    def health(self) -> dict[str, str]:
        """Each container's state: its health check's verdict where it has one, else its run state."""
        out = {}
        for role, c in self.containers.items():
            w = c.get_wrapped_container()
            w.reload()
            state = w.attrs["State"]
            out[role] = state.get("Health", {}).get("Status") or state["Status"]
        return out


def new_system(layout: Layout) -> System:
    run = uuid.uuid4().hex[:6]
    network = Network(docker_network_kw={"labels": {"io.ibpool.chaos": run}})
    network.name = f"ibpool-chaos-{run}"
    network.create()
    return System(layout=layout, run=run, network=network)
