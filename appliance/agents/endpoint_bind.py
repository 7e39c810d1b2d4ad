"""Where an external-rollout job's student endpoint listens, and the address its clients are given.

By default the endpoint listens on loopback on any free port: only agents on
the box reach it. An administrator lets agents on other hosts in with
`appliance serve --agent-endpoint-addr HOST[:PORT[-PORT]]` (a fixed port range
is what a container publishes) and `--agent-endpoint-host NAME` (the name
those hosts reach the box by, put in the URL `GET /jobs/{id}/endpoint` hands
out). It is the daemon's setting, not a job's: a job cannot open a port to the
network. The daemon passes it to its workers in the environment (ENV_ADDR,
ENV_HOST); the daemon itself always forwards submissions over loopback.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Mapping

from appliance.errors import UsageError

ENV_ADDR = "APPLIANCE_AGENT_ENDPOINT_ADDR"
ENV_HOST = "APPLIANCE_AGENT_ENDPOINT_HOST"
LOOPBACK = "127.0.0.1"
MAX_PORTS = 1024  # a range wider than this is a typo, not a plan

# HOST (a name or IPv4) or [IPv6], then an optional :PORT or :LOW-HIGH.
_ADDR = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]+))(?::(?P<low>\d{1,5})(?:-(?P<high>\d{1,5}))?)?$"
)
# RFC 1123 host names: labels of letters, digits and inner hyphens, at most 63 each and 253 in all.
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


class EndpointBindError(UsageError):
    """A bad --agent-endpoint-addr or --agent-endpoint-host; the message names the option and the fix."""


@dataclass(frozen=True)
class EndpointBind:
    """The endpoint's listening address (`ports`: an inclusive range, None for any free port) and public name."""

    host: str = LOOPBACK
    ports: tuple[int, int] | None = None
    public_host: str | None = None

    def port_choices(self, previous: int | None) -> list[int]:
        """Ports to try in order: the job's previous port first (when allowed), then the range; [0] for any."""
        if self.ports is None:
            return ([previous] if previous else []) + [0]  # 0: the kernel picks a free port
        low, high = self.ports
        ordered = list(range(low, high + 1))
        if previous in ordered:
            ordered.remove(previous)
            ordered.insert(0, previous)
        return ordered

    def client_url(self, port: int) -> str:
        """The URL clients are given: the public name, else the bound host (loopback, or an address)."""
        host = self.public_host or self.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/v1"

    def local_url(self, port: int) -> str:
        """The URL the daemon forwards to: loopback, whatever address the endpoint listens on."""
        # The loopback of the family the endpoint listens on: an IPv6-only socket does not answer on 127.0.0.1.
        loopback = "[::1]" if ":" in self.host else LOOPBACK
        return f"http://{loopback}:{port}/v1"

    def environment(self) -> dict[str, str]:
        """The workers' environment that carries this setting (empty for the default)."""
        env = {}
        if self.host != LOOPBACK or self.ports is not None:
            low, high = self.ports or (0, 0)
            host = f"[{self.host}]" if ":" in self.host else self.host
            env[ENV_ADDR] = host if self.ports is None else f"{host}:{low}-{high}"
        if self.public_host:
            env[ENV_HOST] = self.public_host
        return env


LOOPBACK_ANY_PORT = EndpointBind()


def parse_bind(addr: str | None, public_host: str | None = None) -> EndpointBind:
    """`HOST[:PORT[-PORT]]` and a public name -> EndpointBind; EndpointBindError naming the option."""
    if public_host is not None and not _HOSTNAME.fullmatch(public_host):
        try:
            ipaddress.ip_address(public_host)
        except ValueError:
            raise EndpointBindError(
                f"--agent-endpoint-host {public_host[:80]!r} is not a host name or IP address; "
                "give the name other hosts reach this box by, e.g. gpu-box.lab"
            ) from None
    if not addr:
        if public_host is not None:
            raise EndpointBindError(
                f"--agent-endpoint-host {public_host!r} needs --agent-endpoint-addr: the endpoint listens on "
                "loopback unless told otherwise (e.g. --agent-endpoint-addr 0.0.0.0:9500-9509)"
            )
        return LOOPBACK_ANY_PORT
    match = _ADDR.fullmatch(addr.strip())
    if match is None:
        raise EndpointBindError(
            f"--agent-endpoint-addr {addr[:80]!r} must be HOST[:PORT[-PORT]], e.g. 0.0.0.0:9500-9509 or [::]:9500"
        )
    host = match["v6"] or match["host"]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise EndpointBindError(
            f"--agent-endpoint-addr host {host[:80]!r} must be an IP address to listen on (0.0.0.0 for all, "
            "or one interface's address); put the name clients use in --agent-endpoint-host"
        ) from None
    ports = None
    if match["low"]:
        low, high = int(match["low"]), int(match["high"] or match["low"])
        if not 1 <= low <= high <= 65535 or high - low + 1 > MAX_PORTS:
            raise EndpointBindError(
                f"--agent-endpoint-addr ports {low}-{high} must be a range within 1-65535 of at most "
                f"{MAX_PORTS} ports, low first"
            )
        ports = (low, high)
    if address.is_loopback and public_host is not None:
        raise EndpointBindError(
            f"--agent-endpoint-host {public_host!r} names this box for other hosts, but --agent-endpoint-addr "
            f"{addr[:80]!r} listens on loopback only: listen on 0.0.0.0 (or an interface's address) too"
        )
    # 0.0.0.0 is where to listen, not an address a client can be given.
    if address.is_unspecified and public_host is None:
        raise EndpointBindError(
            f"--agent-endpoint-addr {addr[:80]!r} listens on every address: also set --agent-endpoint-host to the "
            "name other hosts reach this box by, which the endpoint's URL is given with"
        )
    return EndpointBind(host, ports, public_host)


def bind_from_environment(environ: Mapping[str, str]) -> EndpointBind:
    """The setting the daemon gave this worker (the default when it gave none)."""
    return parse_bind(environ.get(ENV_ADDR), environ.get(ENV_HOST) or None)
