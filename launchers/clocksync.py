"""Clock-sync samples: NTP-style ping-pong between each clock domain's leader and rank 0.

Kineto stamps events with CLOCK_REALTIME, which differs between hosts (and between processes
under libfaketime). To align ranks later, every *clock domain* (host + boot id + the difference
realtime − monotonic rounded to 1 ms; see docs/run-directory.md) elects its lowest rank as leader;
each leader outside rank 0's domain exchanges :data:`ROUNDS` ping-pongs with the reference rank 0
after ``init_process_group`` and at the end of every profiler window. Each round yields four int64
ns stamps of ``time.time_ns()``: ``t1`` leader sends, ``t2`` reference receives, ``t3`` reference
replies, ``t4`` leader receives. Only raw samples are recorded; fitting is the merge's job.

Transport: after ``init_process_group``, every rank joins a dedicated gloo process group (works
whatever the training backend, gloo or NCCL) used to learn the domains. The ping-pong itself goes
over plain TCP connections from each syncing leader to rank 0 (``TCP_NODELAY``, kept open for the
run), whose address travels through that group; measured here, TCP loopback ping-pong has a
minimum RTT of ~16 µs against ~124 µs for gloo ``send``/``recv``, i.e. an 8x tighter bound. If any
leader cannot connect, all ranks agree (through the group) to ping-pong over gloo instead. Every
wait has a timeout (:data:`SYNC_TIMEOUT_S`), so a missing peer never hangs the job; after a
failure the runtime stops syncing.

Who can talk to rank 0's listener (docs/security.md): it listens on an ephemeral port of every
interface (the leaders reach it under whichever of rank 0's names routes: MASTER_ADDR, its FQDN,
its host name), only during :func:`setup` and for at most :data:`ACCEPT_TIMEOUT_S`, and closes
once every leader is in. Each connection must open with a per-run secret (:data:`TOKEN_BYTES`
random bytes drawn by rank 0 for this run) that travels with the address through the job's own
gloo group, so only the job's processes know it; a connection without it (or naming a rank that
is not a syncing leader, or a second time) is closed unread. Data from the peers is fixed-size
int64 stamps, never unpickled.
"""

from __future__ import annotations

import datetime as dt
import enum
import hmac
import os
import platform
import secrets
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Ping-pong rounds per exchange (the merge keeps the lowest-RTT ones).
ROUNDS = 50
#: Seconds a sync peer may be missing before the exchange gives up.
SYNC_TIMEOUT_S = 60.0
#: Rank whose clock every other rank is aligned to.
REFERENCE_RANK = 0
#: Where Linux publishes the boot id (changes at every reboot).
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
#: Environment variable choosing the transport: "tcp" (default) or "gloo" (e.g. where ports
#: between nodes are closed except those of the process groups).
ENV_TRANSPORT = "RANKSCOPE_CLOCK_TRANSPORT"
#: Seconds a leader tries each published address of rank 0 before the next one.
CONNECT_TIMEOUT_S = 5.0
#: Seconds rank 0 waits for all leaders to connect.
ACCEPT_TIMEOUT_S = 15.0
#: Seconds rank 0 waits for a new connection's hello (token and rank) before closing it.
HELLO_TIMEOUT_S = 2.0
#: Length of the per-run secret every connection to rank 0 must send first.
TOKEN_BYTES = 32
#: Wire format of one ping (t1) and one pong (t2, t3): little-endian int64 ns.
PING = struct.Struct("<q")
PONG = struct.Struct("<qq")
#: Resolution of the realtime − monotonic difference in the domain key, in ns (1 ms).
DOMAIN_RESOLUTION_NS = 1_000_000


def boot_id() -> str:
    """This machine's boot id ("unknown" where the kernel does not publish one)."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def realtime_minus_monotonic_ns() -> int:
    """``time.time_ns() - time.monotonic_ns()`` in ns, from the tightest of a few paired reads."""
    best: tuple[int, int] | None = None
    for _ in range(5):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        gap = m1 - m0
        if best is None or gap < best[0]:
            best = (gap, r - (m0 + m1) // 2)
    assert best is not None
    return best[1]


def clock_domain() -> str:
    """Key shared by exactly the processes that read the same CLOCK_REALTIME.

    ``host/boot-id/<realtime − monotonic in ms>``: the last part separates a process whose
    realtime clock is shifted (libfaketime) from its neighbours on the same host.
    """
    diff_ms = round(realtime_minus_monotonic_ns() / DOMAIN_RESOLUTION_NS)
    return f"{platform.node()}/{boot_id()}/{diff_ms}"


class Transport(enum.StrEnum):
    """How the ping-pong travels (recorded as ``clock.method`` in meta.json)."""

    TCP = "tcp-pingpong"
    GLOO = "gloo-pingpong"


@dataclass
class ClockSync:
    """The domains of all ranks and the group used to exchange samples."""

    rank: int
    """This process's global rank."""
    domain: str
    """This rank's clock domain."""
    domains: list[str]
    """Clock domain of every rank, by rank."""
    group: Any
    """The gloo process group used for the ping-pong."""
    failed: str | None = None
    """Why syncing stopped (None while it works)."""
    transport: Transport = Transport.GLOO
    """TCP when every syncing leader reached rank 0, else gloo send/recv."""
    sockets: dict[int, socket.socket] = field(default_factory=dict)
    """Open TCP connections: on rank 0 one per syncing leader, on a leader the one to rank 0."""
    leaders: dict[str, int] = field(init=False)
    """Leader (lowest rank) of each domain."""

    def __post_init__(self) -> None:
        self.leaders = {}
        for rank, domain in enumerate(self.domains):
            self.leaders.setdefault(domain, rank)

    @property
    def leader_rank(self) -> int:
        """The rank that syncs for this rank's domain."""
        return self.leaders[self.domain]

    @property
    def syncing_leaders(self) -> list[int]:
        """Leaders that exchange samples with the reference (not in the reference's domain)."""
        reference_domain = self.domains[REFERENCE_RANK]
        return sorted(r for d, r in self.leaders.items() if d != reference_domain)

    @property
    def records_samples(self) -> bool:
        """True when this rank is a leader that syncs with the reference."""
        return self.rank in self.syncing_leaders

    def describe(self) -> dict[str, Any]:
        """The ``clock`` fields of meta.json other than ``samples``."""
        return {
            "domain": self.domain,
            "leader_rank": self.leader_rank,
            "reference_rank": REFERENCE_RANK,
            "method": str(self.transport),
        }

    def close_sockets(self) -> None:
        """Close the TCP connections (the exchange then goes through the gloo group)."""
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()

    def close(self) -> None:
        """At the end of the run: close the TCP connections and let go of the gloo group.

        Why drop the group: after the script's ``destroy_process_group()`` this reference is
        the group's last one, so its C++ object (gloo's worker threads and their work) would
        otherwise be destroyed during the interpreter's finalization, where destroying work
        that holds Python objects aborts the process (SIGABRT, "terminate called without an
        active exception"). Dropped here (``RankRuntime.close``, at exit), it is destroyed while
        the interpreter still runs."""
        self.close_sockets()
        self.group = None


def _reference_addresses() -> list[str]:
    """Addresses under which rank 0 may be reached, best first."""
    names = [os.environ.get("MASTER_ADDR", ""), socket.getfqdn(), platform.node(), "127.0.0.1"]
    return list(dict.fromkeys(n for n in names if n))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = b""
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("clock-sync peer closed the connection")
        buf += chunk
    return buf


def _connect(
    addresses: list[str], port: int, rank: int, timeout_s: float, token: bytes
) -> socket.socket | None:
    """A leader's connection to rank 0 (None if no address answers); sends token and rank."""
    for host in addresses:
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError:
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout_s)
        sock.sendall(token + PING.pack(rank))  # hello: the run's secret, then who I am
        return sock
    return None


def _accept(
    server: socket.socket,
    leaders: list[int],
    timeout_s: float,
    token: bytes,
    accept_timeout_s: float = ACCEPT_TIMEOUT_S,
) -> dict[int, socket.socket]:
    """Rank 0 accepts one connection per syncing leader (fewer if some never come).

    A connection is kept only when its hello is the run's ``token`` followed by the rank of a
    syncing leader not yet connected; any other is closed (module docstring).
    """
    conns: dict[int, socket.socket] = {}
    deadline = time.monotonic() + accept_timeout_s
    while len(conns) < len(leaders) and time.monotonic() < deadline:
        server.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock, _ = server.accept()
        except OSError:
            continue
        try:
            sock.settimeout(min(HELLO_TIMEOUT_S, max(0.01, deadline - time.monotonic())))
            hello = _recv_exact(sock, len(token) + PING.size)
            (rank,) = PING.unpack(hello[len(token) :])
        except OSError:
            sock.close()
            continue
        if (
            not hmac.compare_digest(hello[: len(token)], token)
            or rank not in leaders
            or rank in conns
        ):
            sock.close()  # not one of this job's leaders
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout_s)
        conns[int(rank)] = sock
    return conns


def setup(timeout_s: float = SYNC_TIMEOUT_S) -> ClockSync:
    """Collective: create the sync group, learn every rank's domain, connect leaders to rank 0."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    domain = clock_domain()
    server: socket.socket | None = None
    endpoint: tuple[list[str], int, bytes] | None = None
    token = secrets.token_bytes(TOKEN_BYTES)
    want_tcp = os.environ.get(ENV_TRANSPORT, "tcp").lower() != "gloo"
    if rank == REFERENCE_RANK and want_tcp:
        try:
            server = socket.create_server(("", 0), backlog=128)
            endpoint = (_reference_addresses(), server.getsockname()[1], token)
        except OSError:
            server = None
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (domain, endpoint), group=group)
    sync = ClockSync(rank=rank, domain=domain, domains=[str(d) for d, _ in gathered], group=group)
    reference_endpoint = gathered[REFERENCE_RANK][1]
    leaders = sync.syncing_leaders
    if not leaders:
        if server is not None:
            server.close()
        return sync
    if reference_endpoint is not None and rank in leaders:
        addresses, port, reference_token = reference_endpoint
        sock = _connect(addresses, port, rank, timeout_s, reference_token)
        if sock is not None:
            sync.sockets[REFERENCE_RANK] = sock
    elif server is not None:
        sync.sockets = _accept(server, leaders, timeout_s, token)
    if server is not None:
        server.close()
    # everyone must agree on the transport: TCP only if rank 0 holds every leader's connection
    verdict: list[Any] = [None]
    if rank == REFERENCE_RANK:
        verdict = [sorted(sync.sockets) == leaders]
    dist.broadcast_object_list(verdict, src=REFERENCE_RANK, group=group)
    if verdict[0]:
        sync.transport = Transport.TCP
    else:
        sync.close_sockets()
    return sync


def exchange(sync: ClockSync, phase: str, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """Collective over rank 0 and the syncing leaders: ``rounds`` ping-pongs per leader.

    Returns this rank's new samples (only syncing leaders get any). Ranks that neither lead nor
    serve return at once, so they are never held up.
    """
    leaders = sync.syncing_leaders
    samples: list[dict[str, Any]] = []
    if sync.transport == Transport.TCP:
        if sync.rank == REFERENCE_RANK:
            for leader in leaders:
                conn = sync.sockets[leader]
                for _ in range(rounds):
                    _recv_exact(conn, PING.size)
                    t2 = time.time_ns()
                    t3 = time.time_ns()
                    conn.sendall(PONG.pack(t2, t3))
        elif sync.rank in leaders:
            conn = sync.sockets[REFERENCE_RANK]
            for _ in range(rounds):
                t1 = time.time_ns()
                conn.sendall(PING.pack(t1))
                t2, t3 = PONG.unpack(_recv_exact(conn, PONG.size))
                t4 = time.time_ns()
                samples.append({"phase": phase, "t1": t1, "t2": t2, "t3": t3, "t4": t4})
        return samples

    import torch
    import torch.distributed as dist

    if sync.rank == REFERENCE_RANK:
        ping = torch.zeros(1, dtype=torch.int64)
        for leader in leaders:
            for _ in range(rounds):
                dist.recv(ping, src=leader, group=sync.group)
                t2 = time.time_ns()
                t3 = time.time_ns()
                dist.send(torch.tensor([t2, t3], dtype=torch.int64), dst=leader, group=sync.group)
    elif sync.rank in leaders:
        ping = torch.zeros(1, dtype=torch.int64)
        pong = torch.zeros(2, dtype=torch.int64)
        for _ in range(rounds):
            t1 = time.time_ns()
            dist.send(ping, dst=REFERENCE_RANK, group=sync.group)
            dist.recv(pong, src=REFERENCE_RANK, group=sync.group)
            t4 = time.time_ns()
            t2, t3 = (int(x) for x in pong.tolist())
            samples.append({"phase": phase, "t1": t1, "t2": t2, "t3": t3, "t4": t4})
    return samples


def offset_ns(sample: dict[str, Any]) -> float:
    """Reference clock minus leader clock in ns for one round (positive: leader behind).

    The one NTP offset formula: the merge's fit (``orchestrator/ingest/clock.py``) applies it to every
    recorded round, and floors it to whole ns there.
    """
    return ((sample["t2"] - sample["t1"]) + (sample["t3"] - sample["t4"])) / 2


def rtt_ns(sample: dict[str, Any]) -> int:
    """Round-trip time of one round in ns, without the reference's turnaround.

    The one RTT formula: the merge's fit (``orchestrator/ingest/clock.py``) uses it too.
    """
    return int((sample["t4"] - sample["t1"]) - (sample["t3"] - sample["t2"]))
