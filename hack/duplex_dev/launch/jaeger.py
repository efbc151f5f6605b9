"""A throwaway Jaeger v2 all-in-one on free loopback ports: the OTLP receiver (HTTP and gRPC), in-memory storage and
the query API, for the traces tests and the router benchmark's tracing variant. The binary is built by
hack/build-tools.sh (`DUPLEX_TOOLS=traces` builds only it) into a version-keyed cache; `jaeger_binary()` finds it.

    with JaegerProcess() as jaeger:
        jaeger.otlp_url          OTLP/HTTP base URL (the router's tracing.endpoint); + "/v1/traces" for vLLM's
                                 http/protobuf exporter
        jaeger.otlp_grpc         host:port of the OTLP/gRPC receiver (vLLM's default protocol)
        jaeger.spans(trace_id)   the trace's spans as stored (query API v3), [] while it holds none
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duplex_dev import processes
from duplex_dev.processes import LaunchError, free_port
from duplex_dev.versions import built_tool, cache_dir, version

BUILD_HINT = "run `DUPLEX_TOOLS=traces bash hack/build-tools.sh` (hack/setup.sh builds it with the test tools)"

# Jaeger v2 takes an OpenTelemetry collector config; this is cmd/jaeger/internal/all-in-one.yaml cut down to what the
# tests use (OTLP in, memory storage, query API, health), every port on loopback and chosen here. The batch processor
# hands spans to storage within 100 ms, so a query soon sees what arrived.
CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: {host}:{health}
  jaeger_query:
    enable_tracing: false  # on by default: the query service would trace itself to localhost:4317
    storage:
      traces: memstore
    http:
      endpoint: {host}:{query}
    grpc:
      endpoint: {host}:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {max_traces}
receivers:
  otlp:
    protocols:
      http:
        endpoint: {host}:{otlp_http}
      grpc:
        endpoint: {host}:{otlp_grpc}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


class JaegerMissing(LaunchError):
    pass


def jaeger_binary() -> Path:
    """The Jaeger binary of the pinned version in the tools cache; JaegerMissing, with the command that builds it."""
    path = built_tool("jaeger", "JAEGER_VERSION")
    if path is None:
        raise JaegerMissing(f"jaeger {version('JAEGER_VERSION')} is missing in {cache_dir()}: {BUILD_HINT}")
    return path


@dataclass(frozen=True)
class StoredSpan:
    """One span as Jaeger stored it, ids in hex."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: int  # OTLP's SpanKind: 1 internal, 2 server, 3 client
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    error: bool = False


def _value(v: dict[str, Any]) -> Any:
    for key, cast in (("stringValue", str), ("intValue", int), ("boolValue", bool), ("doubleValue", float)):
        if key in v:
            return cast(v[key])
    return v


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value") or {}) for a in items or []}


def parse_otlp(result: dict[str, Any]) -> list[StoredSpan]:
    """The spans of an OTLP JSON answer ({"resourceSpans": [...]}) of Jaeger's query API v3."""
    out = []
    for rs in result.get("resourceSpans") or []:
        resource = _attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or []:
            for s in ss.get("spans") or []:
                out.append(
                    StoredSpan(
                        trace_id=s["traceId"],
                        span_id=s["spanId"],
                        parent_id=s.get("parentSpanId") or "",
                        name=s["name"],
                        kind=int(s.get("kind") or 0),
                        service=str(resource.get("service.name", "")),
                        attributes=_attributes(s.get("attributes")),
                        resource=resource,
                        error=(s.get("status") or {}).get("code") == 2,
                    )
                )
    return out


def only(spans: list[StoredSpan], **match: object) -> StoredSpan:
    """The one span whose fields equal `match` (service, name, ...); an AssertionError naming every span otherwise."""
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.service, s.name, s.span_id, s.parent_id) for s in spans])
    return found[0]


class JaegerProcess:
    def __init__(self, host: str = "127.0.0.1", binary: Path | None = None, startup_timeout: float = 30.0):
        self.binary = binary or jaeger_binary()
        self.host = host
        self.otlp_http, self.otlp_grpc_port = free_port(host), free_port(host)
        self.query, self.query_grpc, self.health = free_port(host), free_port(host), free_port(host)
        self.startup_timeout = startup_timeout
        self.dir = tempfile.mkdtemp(prefix="duplex-jaeger-")
        self.config_path = os.path.join(self.dir, "config.yaml")
        self.log_path = os.path.join(self.dir, "jaeger.log")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def otlp_url(self) -> str:
        return f"http://{self.host}:{self.otlp_http}"

    @property
    def otlp_grpc(self) -> str:
        return f"{self.host}:{self.otlp_grpc_port}"

    @property
    def query_url(self) -> str:
        return f"http://{self.host}:{self.query}"

    def start(self) -> JaegerProcess:
        with open(self.config_path, "w") as f:
            f.write(
                CONFIG.format(
                    host=self.host,
                    health=self.health,
                    query=self.query,
                    query_grpc=self.query_grpc,
                    otlp_http=self.otlp_http,
                    otlp_grpc=self.otlp_grpc_port,
                    max_traces=100_000,
                )
            )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "--config", self.config_path], stdout=log, stderr=subprocess.STDOUT
            )
        status = f"http://{self.host}:{self.health}/status"
        startup = processes.Startup(
            f"jaeger on {status}",
            lambda: processes.answers(status) and processes.answers(self.query_url + "/api/services"),
            self.process.poll,
            self.log_path,
            self.startup_timeout,
        )
        try:
            startup.wait()
        except LaunchError:
            self.stop()
            raise
        return self

    def spans(self, trace_id: str) -> list[StoredSpan]:
        """The trace's spans Jaeger holds now ([] while it holds none of them)."""
        try:
            with urllib.request.urlopen(f"{self.query_url}/api/v3/traces/{trace_id}", timeout=5) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return []
            raise
        return parse_otlp(body.get("result") or {})

    def log_tail(self, lines: int = 40) -> str:
        return processes.log_tail(self.log_path, lines)

    def stop(self) -> int | None:
        """Stop Jaeger; its directory (config, log) goes with it unless it did not exit cleanly."""
        code = processes.stop_child(self.process, timeout=10)
        if code == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def __enter__(self) -> JaegerProcess:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()
