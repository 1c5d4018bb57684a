"""The air gap, enforced and recorded: a socket guard for this process and every Python process
it starts.

    install()                 guard this process (idempotent); `uninstall()` undoes it
    guarded_env(log, env)     the environment that guards every Python child (and their children)
    read_log(log)             the records: one "install" per guarded process, one per "violation"

What the guard does. `socket.socket.connect`, `connect_ex`, `sendto` and `sendmsg` (TCP and UDP
alike: a UDP `connect()` sends nothing, but it is how programs pick a route to the outside, and
the next datagram goes there) accept only loopback destinations (127.0.0.0/8, ::1, an IPv4-mapped
loopback, `localhost`), the unspecified address (which Linux routes to this host) and local
families (AF_UNIX, AF_NETLINK). Name resolution (`getaddrinfo`, `gethostbyname[_ex]`) of any
other name is refused too, because a DNS query leaves the machine before any connect. Anything
else raises `AirGapViolation` (a `PermissionError`, what a firewall's refusal looks like to the
caller; `connect_ex` returns EACCES instead, per its contract), prints one line on stderr and is
appended to the log named by `$MEDCLAW_AIRGAP_LOG`. The log matters because callers may swallow
the error: vLLM's IP discovery catches every exception and carries on.

Beyond loopback. A deployment whose models run on `vllm serve` hosts of the hospital network names
them in its config file (`endpoints:`); `medclaw doctor --airgap --config FILE -- COMMAND` passes
exactly those `host:port` pairs in `$MEDCLAW_AIRGAP_ALLOW` (a name there may be resolved, and its
addresses are then allowed on the same ports). Nothing else is ever added.

How it reaches child processes. `guarded_env` puts `airgap_site/` first on PYTHONPATH and sets
`MEDCLAW_AIRGAP=1`; Python imports `sitecustomize` from there at start-up, before any user code,
and it installs the guard (then runs any other `sitecustomize` it shadows). So vLLM's engine
processes (multiprocessing spawn: a fresh interpreter that inherits the environment), shells
and `medclaw` subcommands are all covered. Every guarded process writes an "install" record,
so a test can check both that the guard ran where it should and that nothing was refused.

Limits, stated so that nobody over-reads a clean log: the guard sees Python's socket layer.
Native code that opens sockets itself (ZeroMQ, gloo, NCCL, FFmpeg) is not intercepted; those
connect to addresses vLLM derives from `VLLM_HOST_IP`, which `medclaw` pins to 127.0.0.1
(`medclaw.OFFLINE_ENV`). A Python started with `-S`, `-I` or `-E` skips sitecustomize.

This module imports nothing outside the standard library: `sitecustomize` loads it by file path,
in interpreters that may not have `medclaw` importable.
"""
from __future__ import annotations

import errno
import functools
import ipaddress
import json
import os
import socket
import sys
import traceback

ENV_SWITCH = "MEDCLAW_AIRGAP"            # "1": every Python process installs the guard at start-up
ENV_LOG = "MEDCLAW_AIRGAP_LOG"           # JSON Lines file: install + violation records
ENV_ALLOW = "MEDCLAW_AIRGAP_ALLOW"       # host:port list beyond loopback (a config's remote endpoints)
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "airgap_site")
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
LOCAL_FAMILIES = {socket.AF_UNIX} | ({socket.AF_NETLINK} if hasattr(socket, "AF_NETLINK") else set())
_MARK = "_medclaw_airgap"                # attribute on our wrappers (idempotence across copies)
_MAX_RECORD = 3500                       # one os.write below PIPE_BUF: appends stay whole


class AirGapViolation(PermissionError):
    """A connection or lookup that would leave this machine."""

    def __init__(self, message: str):
        super().__init__(errno.EACCES, message)

    def __str__(self) -> str:
        return self.strerror


# ---------------------------------------------------------------------------------------------
# policy

def is_local_host(host) -> bool:
    """True for loopback / unspecified IPs and the loopback names; False for any other host."""
    if host is None or host in ("", b""):
        return True                      # getaddrinfo(None, …) / connect(("", p)): this host
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip().rstrip(".").lower()
    if host in LOCAL_NAMES or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False                     # a name we would have to resolve
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def is_local_address(family, address) -> bool:
    """True if a socket of `family` may send to `address` without leaving the machine."""
    if family in LOCAL_FAMILIES or isinstance(address, (str, bytes)):
        return True                      # AF_UNIX paths, netlink
    if family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address:
        return is_local_host(address[0])
    return False                         # raw packets, Bluetooth, CAN, …


def parse_allow(text: str) -> set[tuple[str, int]]:
    """`host:port,[v6]:port,…` (the `$MEDCLAW_AIRGAP_ALLOW` format) → {(host, port)}."""
    out = set()
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"{ENV_ALLOW}: expected host:port, got {item!r}")
        out.add((host.strip("[]").lower(), int(port)))
    return out


def _permitted(family, address) -> bool:
    """Loopback, or a host:port named in `$MEDCLAW_AIRGAP_ALLOW` (or an address it resolved to)."""
    if is_local_address(family, address):
        return True
    if family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and len(address) >= 2:
        target = (str(address[0]).lower(), address[1])
        return target in _ALLOW or target in _RESOLVED
    return False


_ALLOW: set[tuple[str, int]] = set()        # from $MEDCLAW_AIRGAP_ALLOW at install
_RESOLVED: set[tuple[str, int]] = set()     # addresses the allowed names resolved to


# ---------------------------------------------------------------------------------------------
# log

def _write(record: dict) -> None:
    path = os.environ.get(ENV_LOG)
    if not path:
        return
    line = json.dumps(record, default=str)
    if len(line) > _MAX_RECORD:
        record["argv"] = record.get("argv", [])[:2]
        record["where"] = str(record.get("where", ""))[:200]
        line = json.dumps(record, default=str)[:_MAX_RECORD]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass                             # the raise (and stderr line) still report it


def _caller() -> str:
    """file:line of the first frame outside this module and the socket machinery."""
    skip = (os.path.abspath(__file__), socket.__file__, "/ssl.py", "/asyncio/")
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(part in frame.filename for part in skip):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "?"


def _process() -> dict:
    return {"pid": os.getpid(), "ppid": os.getppid(), "argv": list(sys.argv[:6]) or [sys.executable]}


def _format_address(address) -> str:
    if not isinstance(address, tuple) or len(address) < 2:
        return str(address)
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _refuse(call: str, family, kind, address) -> AirGapViolation:
    where = _caller()
    fam = getattr(family, "name", str(family))
    proto = {socket.SOCK_STREAM: "tcp", socket.SOCK_DGRAM: "udp"}.get(kind, getattr(kind, "name", str(kind)))
    target = _format_address(address)
    _write({"event": "violation", "call": call, "family": fam, "proto": proto, "address": target,
            "where": where, **_process()})
    action = f"lookup of {target}" if proto == "lookup" else f"{call} to {target} ({proto})"
    message = (f"medclaw air gap: {action} refused: only loopback is allowed "
               f"[pid {os.getpid()}, {where}]")
    try:
        print(message, file=sys.stderr, flush=True)
    except Exception:
        pass
    return AirGapViolation(message)


# ---------------------------------------------------------------------------------------------
# wrappers

def _guard(method, call: str):
    """Wrap socket method `method` (named `call`) with the destination check."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        address = _address_arg(call, args)
        if address is not None and not _permitted(self.family, address):
            error = _refuse(call, self.family, self.type, address)
            if call == "connect_ex":
                return error.errno
            raise error
        return method(self, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def _address_arg(call: str, args: tuple):
    if call in ("connect", "connect_ex"):
        return args[0] if args else None
    if call == "sendto":                 # sendto(data, address) | sendto(data, flags, address)
        return args[-1] if len(args) >= 2 else None
    if call == "sendmsg":                # sendmsg(buffers[, ancdata[, flags[, address]]])
        return args[3] if len(args) >= 4 else None
    return None


def _guard_lookup(function, call: str):
    @functools.wraps(function)
    def wrapper(host, *args, **kwargs):
        name = (host.decode() if isinstance(host, bytes) else str(host or "")).lower()
        ports = {port for allowed, port in _ALLOW if allowed == name}
        # a numeric address resolves without a query; connecting to it is what gets checked
        if not (ports or is_local_host(host) or _is_numeric(host)):
            raise _refuse(call, "name", "lookup", str(host))
        result = function(host, *args, **kwargs)
        if ports:                        # an allowed name: its addresses are allowed, same ports
            found = [result] if isinstance(result, str) else (
                [entry[4][0] for entry in result] if call == "getaddrinfo" else result[2])
            _RESOLVED.update((str(ip).lower(), port) for ip in found for port in ports)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _is_numeric(host) -> bool:
    try:
        ipaddress.ip_address(str(host.decode() if isinstance(host, bytes) else host).split("%", 1)[0])
        return True
    except ValueError:
        return False


_SOCKET_METHODS = ("connect", "connect_ex", "sendto", "sendmsg")
_LOOKUPS = ("getaddrinfo", "gethostbyname", "gethostbyname_ex")


def installed() -> bool:
    return bool(getattr(socket.socket.connect, _MARK, False))


def install() -> bool:
    """Guard this process. Returns False if it already was (by this or another copy of us)."""
    if installed():
        return False
    _ALLOW.update(parse_allow(os.environ.get(ENV_ALLOW, "")))
    for name in _SOCKET_METHODS:
        if hasattr(socket.socket, name):
            setattr(socket.socket, name, _guard(getattr(socket.socket, name), name))
    for name in _LOOKUPS:
        setattr(socket, name, _guard_lookup(getattr(socket, name), name))
    _write({"event": "install", **_process()})
    return True


def uninstall() -> None:
    """Restore the original socket functions (tests; a guarded command never uninstalls)."""
    _ALLOW.clear()
    _RESOLVED.clear()
    for owner, names in ((socket.socket, _SOCKET_METHODS), (socket, _LOOKUPS)):
        for name in names:
            current = getattr(owner, name, None)
            if getattr(current, _MARK, False):
                setattr(owner, name, current.__wrapped__)


# ---------------------------------------------------------------------------------------------
# child processes and the log

def guarded_env(log_path: str | os.PathLike, env: dict | None = None, allow: list[str] = ()) -> dict:
    """A copy of `env` (default: this process's) in which every Python process installs the
    guard at start-up, logs to `log_path` and also accepts the `allow` host:port entries."""
    out = dict(os.environ if env is None else env)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    parse_allow(",".join(allow))                       # fail here on a malformed entry
    out.update({ENV_SWITCH: "1", ENV_LOG: str(log_path), ENV_ALLOW: ",".join(allow),
                "PYTHONPATH": os.pathsep.join([SITE_DIR, *rest])})
    return out


def enable(log_path: str | os.PathLike, allow: list[str] = ()) -> None:
    """Guard this process and every process it starts from now on (changes `os.environ`)."""
    env = guarded_env(log_path, allow=allow)
    for key in (ENV_SWITCH, ENV_LOG, ENV_ALLOW, "PYTHONPATH"):
        os.environ[key] = env[key]
    _ALLOW.update(parse_allow(env[ENV_ALLOW]))
    install()


def read_log(log_path: str | os.PathLike) -> list[dict]:
    """Every record in the log (none when it does not exist); a torn line is a violation."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"event": "violation", "call": "unreadable log line", "address": line[:200]})
    return records


def violations(log_path: str | os.PathLike) -> list[dict]:
    return [r for r in read_log(log_path) if r.get("event") != "install"]


def describe(record: dict) -> str:
    """One line for a violation record."""
    return (f"{record.get('call')} to {record.get('address')} ({record.get('proto', '?')}) "
            f"by pid {record.get('pid', '?')} {' '.join(map(str, record.get('argv') or []))[:120]} "
            f"at {record.get('where', '?')}")
