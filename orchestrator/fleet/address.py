"""Where `--address` points, checked in seconds before Ray starts: a name that cannot be a cluster
address, nothing listening there, or a listener that is no gRPC server (Ray itself would retry a
dead address for a minute, and wait for a deaf one for good)."""

from __future__ import annotations

import os

from store.location_forms import printable


class AddressError(ValueError):
    """A --address that no Ray cluster answers at; the message says what to check."""


TOKEN_ENV_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def auth_hint(address: str, exc: BaseException) -> str:
    """What to set where the cluster at `address` refused us for want of its token (Ray's token
    authentication, `RAY_AUTH_MODE=token`)."""
    sent = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    text = str(exc)
    refused = "Authentication failed" in text or (sent and "InvalidAuthToken" in text)
    what = "rejected the token" if refused else "requires a token"
    hint = (
        f"the Ray cluster at {address} {what} (token authentication): run with RAY_AUTH_MODE=token and "
        "the cluster's token in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, or in "
        "~/.ray/auth_token (`ray get-auth-token` on the head node prints it)"
    )
    if not sent:
        set_vars = [v for v in TOKEN_ENV_VARS if os.environ.get(v)]
        if set_vars:
            hint += f"; {' and '.join(set_vars)} is set, but Ray sends a token only when RAY_AUTH_MODE=token"
    return hint


def connect_error(address: str | None, exc: BaseException) -> AddressError:
    """`ray.init`'s ConnectionError as one line: a refused token says what to set; anything else
    names the address and the cause Ray chained below its generic message."""
    causes = []
    while exc is not None and len(causes) < 8:
        causes.append(exc)
        exc = exc.__cause__ or exc.__context__
    text = " ".join(" ".join(str(c).split()) for c in causes)
    shown = printable(address or "local")
    if any(type(c).__name__ == "AuthenticationError" for c in causes) or "InvalidAuthToken" in text:
        return AddressError(f"--address {shown}: {auth_hint(shown, causes[-1])}")
    last = " ".join(str(causes[-1]).split())[-300:]
    return AddressError(f"--address {shown}: Ray could not join the cluster there ({last})")


def check_ray_address(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail in seconds, before Ray starts, when nothing listens at `address` (Ray itself retries a
    dead address for a minute and then prints a page of log). None and "local" start a private
    Ray; "auto" must find a cluster started on this machine with `ray start`."""
    import socket

    if address in (None, "", "local"):
        return
    shown = printable(address)  # a newline must not split the line
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            address = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError):
            address = None
        if not address:
            raise AddressError(
                "--address auto: no Ray cluster runs on this machine (start one with `ray start --head`, "
                "give its address, or leave out --address for a private local Ray)"
            )
    target = address.removeprefix("ray://")
    if "://" in target:
        raise AddressError(
            f"--address {shown}: give HOST:PORT (the cluster's GCS, e.g. head:6379) or ray://HOST:10001; "
            f"an http:// address is the dashboard, which `orchestrate submit` uses"
        )
    host, _, port_text = target.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"--address {shown}: expected HOST:PORT, e.g. 10.0.0.5:6379 or ray://head:10001")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port_text)), timeout=timeout_s)
    except UnicodeError:  # a host name no DNS label can hold
        raise AddressError(f"--address {shown[:80]}...: {host[:60]!r}... is not a host name") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise AddressError(
            f"--address {shown}: nothing answers at {host}:{port_text} ({reason}); is the cluster up "
            "(`ray status` on its head node) and the port open from here?"
        ) from None
    with conn:
        _check_grpc(conn, shown, f"{host}:{port_text}", timeout_s)
    if not address.startswith("ray://"):
        _check_token(target, shown, timeout_s)


def _check_token(gcs: str, shown: str, timeout_s: float) -> None:
    """Fail in a second where the cluster's GCS refuses us for want of its token: `ray.init` would
    retry the refusal for 20 s, then raise a ConnectionError that hides it. One GCS client's first
    call says so at once. Any other outcome (an answer, an error, no answer in `timeout_s`) is left
    to `ray.init`."""
    import threading

    found: list[BaseException] = []

    def probe() -> None:
        try:
            from ray._raylet import GcsClient

            GcsClient(address=gcs)
        except Exception as exc:
            found.append(exc)

    worker = threading.Thread(target=probe, name="gcs-token-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if found and type(found[0]).__name__ == "AuthenticationError":
        raise AddressError(f"--address {shown}: {auth_hint(shown, found[0])}")


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""An HTTP/2 client's first bytes, then an empty SETTINGS frame: a gRPC server (Ray's GCS, its
Client server) answers with a SETTINGS frame of its own."""


def _check_grpc(conn, shown: str, where: str, timeout_s: float) -> None:
    """Fail in seconds where the port takes connections but is no gRPC server (Ray would wait for
    it for good, deaf to SIGTERM): send the HTTP/2 preface and expect a SETTINGS frame back.
    Skipped under RAY_USE_TLS, whose servers expect a TLS handshake first."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    head = b""
    try:
        conn.settimeout(timeout_s)
        conn.sendall(_HTTP2_PREFACE)
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        raise AddressError(
            f"--address {shown}: {where} accepts connections but sent nothing in {timeout_s:g} s; it is "
            "not a Ray cluster's GCS (head:6379) or Ray Client server (ray://head:10001), or it hangs"
        ) from None
    except OSError:  # reset or closed on us: judged by what came before
        pass
    if len(head) < 9 or head[3] != 4:
        raise AddressError(
            f"--address {shown}: {where} answers, but not as a Ray cluster (no gRPC); give the GCS address "
            "(head:6379) or ray://head:10001, not the dashboard or another service"
        )
