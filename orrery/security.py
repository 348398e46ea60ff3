"""Access control for Orrery's gRPC servers and their clients: who may call what, over which channel.

Why this lives in `orrery/`: the three servers (ControllerService in controller/, RolloutService
in rollout/, EnvService in sandbox/) and their clients all need the same locks, and `orrery` is
the one package every one of them may import (DESIGN.md section 2) while it imports no other
first-party package. It is hand-written; the generated code is in `orrery/v1/` beside it, and
this module only reads the service names from those descriptors. `sandbox/` was the other
candidate, but rollout may import only the sandbox's client side, and access control is part of
the wire, not of isolating untrusted code.

The locks (docs/threat-model.md says what each one stops):

- **Loopback unless locked.** `check_listen` refuses a server address other than loopback
  (127.0.0.0/8, ::1, localhost) unless the server has a TLS certificate and key *and* a tokens
  file. `tls_client_ca` adds mutual TLS: clients must then present a certificate it signed.
- **Tokens with roles.** A call carries `authorization: Bearer <token>` metadata. The tokens
  file maps the SHA-256 of each token to a name and roles (`ROLES`); `METHOD_ROLES` says which
  roles each method accepts. No or unknown token: UNAUTHENTICATED. Known token without the role:
  PERMISSION_DENIED. Either is logged and rejected before the request is even parsed, so it
  changes nothing. Health checks are open (load balancers and probes carry no token);
  reflection needs a valid token of any role; a method missing from the table is denied.
  Tokens are compared as SHA-256 digests with `hmac.compare_digest`, against every entry.
- **Rate limits.** `RateLimiter` is a token bucket per client (the token's name, or the peer's
  IP address when the server runs without tokens); a call over the limit gets
  RESOURCE_EXHAUSTED saying when to retry. The controller limits env submissions.
- **Tokens never in clear off the host, never on a command line.** A client reads its token
  from a file or an environment variable (`ClientSecurity`) and refuses to send it over a
  plaintext channel to a non-loopback address.
- **Paths never on trust.** `inside_roots` resolves symlinks (os.path.realpath) and accepts a
  path only under one of the configured roots.

Tokens file (YAML or JSON; only digests are stored, so the file itself grants nothing):

    tokens:
      - name: alice                 # shown in logs and used as the rate-limit key
        sha256: 5e88...a1f          # hex SHA-256 of the token's UTF-8 bytes
        roles: [envs.write, read]

`python -m orrery.security new-token --name alice --roles envs.write,read` prints a fresh token
and the entry to paste into the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import grpc
import yaml

logger = logging.getLogger(__name__)

# -- roles and the methods they open --------------------------------------------------------------

ENVS_WRITE = "envs.write"  # submit, replace, pause, resume, remove envs
READ = "read"  # env list and details, run status, metrics, worker info
INTERNAL = "internal"  # controller -> rollout worker, rollout worker -> env service
ROLES = (ENVS_WRITE, READ, INTERNAL)

_CONTROLLER = "/orrery.v1.ControllerService/"
_ROLLOUT = "/orrery.v1.RolloutService/"
_ENV = "/orrery.v1.EnvService/"

METHOD_ROLES: Mapping[str, frozenset[str]] = {
    **{_CONTROLLER + m: frozenset({ENVS_WRITE}) for m in ("SubmitEnv", "PauseEnv", "ResumeEnv", "RemoveEnv")},
    **{_CONTROLLER + m: frozenset({READ}) for m in ("ListEnvs", "GetEnv", "GetRunStatus", "StreamMetrics")},
    **{_ROLLOUT + m: frozenset({INTERNAL}) for m in ("RolloutGroup", "UpdateWeights", "Abort")},
    _ROLLOUT + "GetInfo": frozenset({INTERNAL, READ}),
    **{_ENV + m: frozenset({INTERNAL}) for m in ("ListTasks", "Reset", "Step", "Score", "Close")},
}
"""Full method name -> the roles that may call it (any one suffices)."""

OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
"""Callable without a token: health says only SERVING or not, and probes carry no token."""

ANY_ROLE_METHODS = frozenset({"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                              "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"})
"""Callable with any valid token: reflection lists the (public) service schemas."""

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class SecurityError(ValueError):
    """A security setting is missing or wrong: which one, what rule, what was seen."""


# -- tokens ---------------------------------------------------------------------------------------


def token_sha256(token: str) -> str:
    """The hex SHA-256 of a token, as the tokens file stores it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a valid token belongs to."""

    name: str
    roles: frozenset[str]


class TokenTable:
    """The tokens a server accepts. `lookup` is constant time in the token and the table's order."""

    def __init__(self, entries: Iterable[tuple[str, str, Iterable[str]]]):
        """entries: (name, sha256 hex, roles)."""
        self._entries: list[tuple[bytes, Identity]] = []
        names: set[str] = set()
        for i, (name, digest, roles) in enumerate(entries):
            where = f"tokens[{i}]"
            if not isinstance(name, str) or not _NAME.match(name):
                raise SecurityError(f"{where}.name: must match [A-Za-z0-9_.@-]{{1,64}}, got {name!r}")
            if name in names:
                raise SecurityError(f"{where}.name: must be unique, got {name!r} twice")
            names.add(name)
            if not isinstance(digest, str) or not _SHA256_HEX.match(digest):
                raise SecurityError(f"{where}.sha256: must be 64 lowercase hex digits (the token's "
                                    f"SHA-256), got {digest!r}")
            roles = frozenset(roles if not isinstance(roles, str) else [roles])
            unknown = sorted(str(r) for r in roles - set(ROLES))
            if not roles or unknown:
                raise SecurityError(f"{where}.roles: must be a non-empty list of {list(ROLES)}, "
                                    f"got {sorted(map(str, roles))}")
            self._entries.append((bytes.fromhex(digest), Identity(name, roles)))
        if not self._entries:
            raise SecurityError("tokens: must list at least one token")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenTable":
        """Read a tokens file (format in the module docstring)."""
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as error:
            raise SecurityError(f"tokens file {path}: cannot read ({error.strerror})") from None
        except yaml.YAMLError as error:
            raise SecurityError(f"tokens file {path}: not valid YAML/JSON ({' '.join(str(error).split())})") from None
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            raise SecurityError(f"tokens file {path}: must be a mapping with a 'tokens' list")
        entries = []
        for i, entry in enumerate(data["tokens"]):
            if not isinstance(entry, dict) or set(entry) - {"name", "sha256", "roles"}:
                raise SecurityError(f"tokens file {path}: tokens[{i}] must have exactly the keys name, "
                                    f"sha256, roles, got {entry!r}"[:300])
            entries.append((entry.get("name"), entry.get("sha256"), entry.get("roles") or ()))
        try:
            return cls(entries)
        except SecurityError as error:
            raise SecurityError(f"tokens file {path}: {error}") from None

    def lookup(self, token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        found = None
        for expected, identity in self._entries:  # every entry, whatever matches: no early exit
            if hmac.compare_digest(digest, expected):
                found = identity
        return found


def _bearer(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            scheme, _, token = str(value).partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else ""
    return None


# -- rate limits ----------------------------------------------------------------------------------


class RateLimiter:
    """A token bucket per client key: `burst` calls at once, refilled at `per_minute`.

    Keys are few (one per token name or peer address); past `max_keys` the fullest buckets,
    which hold no information, are dropped.
    """

    def __init__(self, per_minute: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000):
        if not per_minute > 0 or burst < 1:
            raise SecurityError(f"rate limit: per_minute must be > 0 and burst >= 1, got {per_minute}, {burst}")
        self.per_minute, self.burst, self.clock, self.max_keys = float(per_minute), int(burst), clock, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0.0 if the call may go ahead (one token taken), else the seconds until it may."""
        rate = self.per_minute / 60.0
        with self._lock:
            now = self.clock()
            tokens, last = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                if len(self._buckets) > self.max_keys:
                    self._forget_full(now, rate)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / rate

    def _forget_full(self, now: float, rate: float) -> None:
        full = [k for k, (t, last) in self._buckets.items() if t + (now - last) * rate >= self.burst]
        for k in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[k]


# -- server side ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerSecurity:
    """How one gRPC server guards its door. The defaults suit a loopback-only server."""

    tls_cert: str = ""
    """PEM certificate chain of the server; with tls_key, the server speaks only TLS."""
    tls_key: str = ""
    """PEM private key of tls_cert."""
    tls_client_ca: str = ""
    """PEM CA certificates; set, every client must present a certificate they signed (mutual TLS)."""
    tokens_file: str = ""
    """Tokens file (YAML/JSON: name, sha256, roles per token); set, every call needs a bearer token."""
    submit_per_minute: float = 30.0
    """Env submissions (and other env changes) one client may make per minute, on average."""
    submit_burst: int = 10
    """Env changes one client may make at once before the per-minute rate applies."""

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert or self.tls_key)


def split_host(address: str) -> str:
    """The host part of host:port (brackets of an IPv6 literal removed)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise SecurityError(f"{what} {path}: cannot read ({error.strerror})") from None


def check_listen(service: str, listen: str, security: ServerSecurity) -> None:
    """Raise SecurityError (one line, saying what to set) if `listen` is not allowed as configured."""
    if bool(security.tls_cert) != bool(security.tls_key):
        raise SecurityError(f"{service}: tls_cert and tls_key must be given together, got "
                            f"tls_cert={security.tls_cert!r} tls_key={security.tls_key!r}")
    if security.tls_client_ca and not security.tls:
        raise SecurityError(f"{service}: tls_client_ca (mutual TLS) needs tls_cert and tls_key too")
    if is_loopback(split_host(listen)):
        return
    missing = [what for what, ok in (("a TLS certificate (tls_cert, tls_key)", security.tls),
                                     ("a tokens file (tokens_file)", bool(security.tokens_file))) if not ok]
    if missing:
        raise SecurityError(f"{service}: listen {listen!r} is not a loopback address; listening there needs "
                            f"{' and '.join(missing)}")


def check_server(service: str, listen: str, security: ServerSecurity) -> None:
    """`check_listen`, and the certificate, key and tokens files are readable and well formed."""
    check_listen(service, listen, security)
    if security.tokens_file:
        TokenTable.load(security.tokens_file)
    server_credentials(security)


def server_credentials(security: ServerSecurity) -> grpc.ServerCredentials | None:
    """TLS credentials of `security`, or None for a plaintext (loopback) server."""
    if not security.tls:
        return None
    pair = (_read(security.tls_key, "tls_key"), _read(security.tls_cert, "tls_cert"))
    client_ca = _read(security.tls_client_ca, "tls_client_ca") if security.tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


class AccessInterceptor(grpc.ServerInterceptor):
    """Checks every call's token and role (when a token table is set) and applies rate limits.

    A rejected call never reaches the servicer: its handler ignores the request bytes and
    aborts, so nothing the caller sent is parsed or changes anything. `rate_limits` maps full
    method names to the limiter that meters them.
    """

    def __init__(self, service: str, tokens: TokenTable | None,
                 rate_limits: Mapping[str, RateLimiter] | None = None):
        self.service = service
        self.tokens = tokens
        self.rate_limits = dict(rate_limits or {})
        self.rejected = 0  # calls refused here (for tests and metrics)
        self._count_lock = threading.Lock()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = details.method
        identity = None
        if self.tokens is not None and method not in OPEN_METHODS:
            token = _bearer(details.invocation_metadata)
            if not token:
                why = "no bearer token" if token is None else "a malformed authorization header"
                return self._reject(handler, grpc.StatusCode.UNAUTHENTICATED, method,
                                    f"{method}: {why}; send 'authorization: Bearer <token>'")
            identity = self.tokens.lookup(token)
            if identity is None:
                return self._reject(handler, grpc.StatusCode.UNAUTHENTICATED, method, f"{method}: unknown token")
            if method not in ANY_ROLE_METHODS:
                allowed = METHOD_ROLES.get(method, frozenset())
                if not allowed & identity.roles:
                    need = " or ".join(sorted(allowed)) or "a role no token has (method not in the table)"
                    return self._reject(handler, grpc.StatusCode.PERMISSION_DENIED, method,
                                        f"{method}: token {identity.name!r} has roles {sorted(identity.roles)}, "
                                        f"needs {need}", identity)
        limiter = self.rate_limits.get(method)
        if limiter is None:
            return handler
        return _wrap(handler, lambda context: self._meter(limiter, method, identity, context))

    def _count(self) -> None:
        with self._count_lock:
            self.rejected += 1

    def _reject(self, handler, code: grpc.StatusCode, method: str, message: str,
                identity: Identity | None = None):
        def abort(_request, context):
            self._count()
            logger.warning("%s refused %s from %s%s: %s %s", self.service, method, context.peer(),
                           f" (token {identity.name!r})" if identity else "", code.name, message)
            context.abort(code, message)

        return _replace_behavior(handler, abort)

    def _meter(self, limiter: RateLimiter, method: str, identity: Identity | None, context) -> None:
        key = f"token:{identity.name}" if identity else f"peer:{_peer_host(context.peer())}"
        wait_s = limiter.take(key)
        if wait_s > 0:
            self._count()
            message = (f"{method}: rate limit of {limiter.burst} at once and {limiter.per_minute:g} per minute "
                       f"exceeded for {key}; retry in {wait_s:.1f}s")
            logger.warning("%s refused %s: RESOURCE_EXHAUSTED %s", self.service, method, message)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def _peer_host(peer: str) -> str:
    """'ipv4:127.0.0.1:5555' -> '127.0.0.1'; the port changes per connection, the host does not."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return split_host(rest.replace("%5B", "[").replace("%5D", "]"))
    return peer


_UNREAD = object()  # what a refused call's request becomes (gRPC takes None for a parse failure)


def _ignore(_data: bytes) -> object:
    return _UNREAD


def _replace_behavior(handler, behavior):
    """A handler of the same kind whose behaviour is `behavior(request, context)` and whose
    request bytes are never parsed."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, _ignore, handler.response_serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, _ignore, handler.response_serializer)
    if handler.response_streaming:
        def stream(request, context):
            behavior(request, context)
            yield from ()

        return grpc.unary_stream_rpc_method_handler(stream, _ignore, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(behavior, _ignore, handler.response_serializer)


def _wrap(handler, check: Callable[[Any], None]):
    """The same handler with `check(context)` run before its behaviour."""
    if handler.request_streaming and handler.response_streaming:
        inner = handler.stream_stream

        def stream_stream(requests, context):
            check(context)
            yield from inner(requests, context)

        return grpc.stream_stream_rpc_method_handler(stream_stream, handler.request_deserializer,
                                                     handler.response_serializer)
    if handler.request_streaming:
        inner = handler.stream_unary

        def stream_unary(requests, context):
            check(context)
            return inner(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, handler.request_deserializer,
                                                    handler.response_serializer)
    if handler.response_streaming:
        inner = handler.unary_stream

        def unary_stream(request, context):
            check(context)
            yield from inner(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer,
                                                    handler.response_serializer)
    inner = handler.unary_unary

    def unary_unary(request, context):
        check(context)
        return inner(request, context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer,
                                               handler.response_serializer)


def make_server(service: str, listen: str, security: ServerSecurity, *, max_workers: int,
                max_receive_bytes: int, max_send_bytes: int, thread_name_prefix: str,
                rate_limited: Iterable[str] = (), maximum_concurrent_rpcs: int | None = None
                ) -> tuple[grpc.Server, AccessInterceptor]:
    """A gRPC server for `service` with the access interceptor and message size limits.

    Checks `listen` first (SecurityError before anything binds). Add servicers, then `bind`.
    """
    check_listen(service, listen, security)
    tokens = TokenTable.load(security.tokens_file) if security.tokens_file else None
    limiter = RateLimiter(security.submit_per_minute, security.submit_burst)
    interceptor = AccessInterceptor(service, tokens, {m: limiter for m in rate_limited})
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix),
        interceptors=(interceptor,),
        options=[("grpc.max_receive_message_length", max_receive_bytes),
                 ("grpc.max_send_message_length", max_send_bytes),
                 ("grpc.max_metadata_size", 16 << 10)],
        maximum_concurrent_rpcs=maximum_concurrent_rpcs,
    )
    return server, interceptor


def bind(server: grpc.Server, service: str, listen: str, security: ServerSecurity) -> int:
    """Add the listening port (TLS when configured); return the bound port or raise OSError."""
    credentials = server_credentials(security)
    port = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
    if not port:
        raise OSError(f"{service}: could not bind {listen!r}")
    logger.info("%s on %s: %s, %s", service, listen, "TLS" + (" (mutual)" if security.tls_client_ca else "")
                if credentials else "plaintext (loopback)", "tokens required" if security.tokens_file else "no tokens")
    return port


# -- client side ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a guarded server. Holds where the token is, never the token itself
    (configs are written to the run directory)."""

    token_file: str = ""
    """File whose first line is the bearer token."""
    token_env: str = ""
    """Environment variable holding the bearer token (used when token_file is empty)."""
    tls_ca: str = ""
    """PEM CA certificates that signed the server's certificate; set, the channel is TLS."""
    tls_cert: str = ""
    """PEM client certificate, for servers that require mutual TLS."""
    tls_key: str = ""
    """PEM private key of tls_cert."""
    tls_server_name: str = ""
    """Name to check the server's certificate against, if not the address's host."""

    def token(self) -> str:
        """The bearer token, '' if none is configured."""
        if self.token_file:
            text = _read(self.token_file, "token_file").decode("utf-8", "replace").strip()
            if not text:
                raise SecurityError(f"token_file {self.token_file}: is empty")
            return text.splitlines()[0].strip()
        if self.token_env:
            return os.environ.get(self.token_env, "").strip()
        return ""


class _BearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                         grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        metadata = [m for m in (details.metadata or ()) if m[0] != "authorization"] + [self._header]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def client_channel(address: str, security: ClientSecurity = ClientSecurity(), *,
                   max_receive_bytes: int = 4 << 20, max_send_bytes: int = 4 << 20,
                   token: str | None = None) -> grpc.Channel:
    """A channel to `address` with TLS (when `tls_ca` is set), the bearer token and size limits.

    `token` overrides the one `security` points at. A token is never sent in clear to a host
    other than loopback: that raises SecurityError.
    """
    token = security.token() if token is None else token
    options = [("grpc.max_receive_message_length", max_receive_bytes),
               ("grpc.max_send_message_length", max_send_bytes)]
    if security.tls_ca:
        if bool(security.tls_cert) != bool(security.tls_key):
            raise SecurityError(f"client of {address}: tls_cert and tls_key must be given together")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(security.tls_ca, "tls_ca"),
            private_key=_read(security.tls_key, "tls_key") if security.tls_key else None,
            certificate_chain=_read(security.tls_cert, "tls_cert") if security.tls_cert else None)
        if security.tls_server_name:
            options.append(("grpc.ssl_target_name_override", security.tls_server_name))
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        if token and not is_loopback(split_host(address)):
            raise SecurityError(f"client of {address}: refusing to send a token in clear to a non-loopback "
                                f"address; set tls_ca (the CA of the server's certificate)")
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, _BearerInterceptor(token)) if token else channel


# -- paths ----------------------------------------------------------------------------------------


def inside_roots(path: str | os.PathLike, roots: Sequence[str | os.PathLike], field: str) -> str:
    """The real path of `path` if it lies under one of `roots` (both with symlinks resolved),
    else SecurityError naming the field, the roots and the value."""
    if not isinstance(path, (str, os.PathLike)) or "\x00" in os.fspath(path) or not os.fspath(path):
        raise SecurityError(f"{field}: must be a non-empty path, got {path!r}")
    real = os.path.realpath(path)
    real_roots = [os.path.realpath(r) for r in roots if os.fspath(r)]
    for root in real_roots:
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return real
    shown = ", ".join(real_roots) or "(none configured)"
    raise SecurityError(f"{field}: must be inside {shown} (symlinks resolved), got {os.fspath(path)!r}"
                        + (f" -> {real!r}" if real != os.path.abspath(path) else ""))


# -- `python -m orrery.security new-token` -------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orrery.security",
                                     description="Make a token and its tokens-file entry.")
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new-token", help="print a fresh token and the entry for the tokens file")
    new.add_argument("--name", required=True)
    new.add_argument("--roles", required=True, help=f"comma-separated, of {', '.join(ROLES)}")
    new.add_argument("--out", help="write the token to this file (mode 0600) instead of printing it")
    args = parser.parse_args(argv)
    roles = [r for r in args.roles.split(",") if r]
    token = secrets.token_urlsafe(32)
    try:
        TokenTable([(args.name, token_sha256(token), roles)])  # validates name and roles
    except SecurityError as error:
        parser.error(str(error))
    if args.out:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        print(f"# token written to {args.out}")
    else:
        print(f"# token (give it to the client; it is not stored anywhere): {token}")
    print(yaml.safe_dump({"tokens": [{"name": args.name, "sha256": token_sha256(token), "roles": roles}]},
                         sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
