"""OpenTelemetry traces of turns, model steps, tool calls and upstream connects.

Configured by the standard environment variables and nothing else, so a node
fits whatever collector the operator already runs:

- ``OTEL_TRACES_EXPORTER`` — ``otlp`` turns tracing on (``none``, the
  default when no endpoint is set, keeps it off);
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` —
  where to send (setting one turns tracing on unless the exporter is
  ``none``); spans go as OTLP/HTTP protobuf (``OTEL_EXPORTER_OTLP_PROTOCOL``
  other than ``http/protobuf`` is refused at start, with what to set);
- ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` as usual.

Off, it costs nothing on any path: ``Tracing.off`` hands out one shared
no-op span and never touches the SDK. Spans are per turn, step and tool call,
never per token. A turn span's context is stored with the session
(``traceparent``) so a node that takes the session over links its rerun to
the trace of the turn that was cut.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["AttributeValue", "Tracing", "TracingError"]

log = logging.getLogger("gateway.tracing")

AttributeValue = str | int | float | bool

_PROPAGATOR: Final = TraceContextTextMapPropagator()
_NO_SPAN: Final = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)


class TracingError(ValueError):
    """The OTEL_* environment asks for something this gateway cannot do; says what to set."""


def _wanted(env: Mapping[str, str]) -> bool:
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    if exporter and exporter != "otlp":
        raise TracingError(
            f"OTEL_TRACES_EXPORTER={exporter!r} is not supported: use 'otlp' (OTLP/HTTP) or 'none'"
        )
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return exporter == "otlp" or bool(endpoint)


class Tracing:
    """The spans of one node: real when the environment configures OTLP, else free no-ops."""

    def __init__(self, tracer: Tracer | None, shutdown: contextlib.ExitStack | None = None) -> None:
        self._tracer = tracer
        self._shutdown = shutdown or contextlib.ExitStack()

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    @classmethod
    def from_env(cls, *, node_id: str = "") -> Tracing:
        """A tracer exporting to the collector the ``OTEL_*`` environment names, or ``off``.

        Raises ``TracingError`` for settings it cannot honour (a wrong
        exporter or protocol), so a misconfigured node says so at start
        instead of silently dropping traces.
        """
        environ = os.environ
        if not _wanted(environ):
            return cls.off()
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        if protocol != "http/protobuf":
            raise TracingError(
                f"OTLP protocol {protocol!r} is not supported: the gateway exports "
                "OTLP/HTTP; set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and point "
                "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)"
            )
        # Imported only when tracing is on: an untraced node never loads the SDK.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes: dict[str, AttributeValue] = {}
        if not environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "realtime-gateway"
        if node_id:
            attributes["service.instance.id"] = node_id
        # What is not given here comes from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        stack = contextlib.ExitStack()
        stack.callback(provider.shutdown)
        log.info("tracing on: OTLP/HTTP spans for turns, steps, tools and upstream connects")
        return cls(provider.get_tracer("realtime-gateway"), stack)

    def close(self) -> None:
        """Flush what is buffered and stop the exporter."""
        self._shutdown.close()

    # ------------------------------------------------------------------ spans

    def start_turn(self, attributes: Mapping[str, AttributeValue], *, follows: str = "") -> Span:
        """A root span for one turn; ``follows`` (a traceparent) links a rerun to its cut turn."""
        if self._tracer is None:
            return _NO_SPAN
        links = []
        if follows:
            parent = trace.get_current_span(_PROPAGATOR.extract({"traceparent": follows}))
            if parent.get_span_context().is_valid:
                links.append(Link(parent.get_span_context(), {"rtgw.link": "takeover"}))
        return self._tracer.start_span(
            "turn",
            context=otel_context.Context(),  # a new trace: turns are not nested
            kind=SpanKind.SERVER,
            attributes=dict(attributes),
            links=links,
        )

    def start_child(
        self, parent: Span, name: str, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span:
        """A span under ``parent`` (a step, a tool call, an upstream connect)."""
        if self._tracer is None or not parent.is_recording():
            return _NO_SPAN
        return self._tracer.start_span(
            name,
            context=trace.set_span_in_context(parent),
            attributes=dict(attributes or {}),
        )

    @contextlib.contextmanager
    def child(
        self, parent: Span, name: str, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Iterator[Span]:
        """``start_child`` as a block: ended on exit, marked as an error if it raised."""
        span = self.start_child(parent, name, attributes)
        try:
            yield span
        except BaseException as exc:
            fail(span, exc)
            raise
        finally:
            span.end()

    @staticmethod
    def traceparent(span: Span) -> str:
        """The W3C ``traceparent`` of ``span`` ("" when it is not recorded)."""
        if not span.get_span_context().is_valid:
            return ""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        return carrier.get("traceparent", "")


def fail(span: Span, error: BaseException | str) -> None:
    """Mark ``span`` as failed with ``error`` (a no-op span ignores it)."""
    if not span.is_recording():
        return
    if isinstance(error, BaseException):
        span.record_exception(error)
        error = f"{type(error).__name__}: {error}"
    span.set_status(Status(StatusCode.ERROR, error))
