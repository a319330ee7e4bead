"""Figures for monitoring: OpenTelemetry instruments and a Prometheus collector.

Every figure is read when a collector asks for it, from the caches open in this process (and the
counters of caches already closed), so the id hot path does no bookkeeping for metrics at all.

**OpenTelemetry** (``pip install sqlalchemy-tickets[otel]``): with the OpenTelemetry API
installed, the first :class:`~sqlalchemy_tickets.CachedSource` made in a process registers
observable instruments on the meter ``sqlalchemy_tickets`` of the global ``MeterProvider`` —
nothing to call. A provider set later still receives them (the API forwards to it). Call
:func:`enable` to register them on a provider of your own instead. Set the environment variable
``SQLALCHEMY_TICKETS_METRICS=off`` to register nothing automatically. Without OpenTelemetry
installed, nothing of it is ever imported.

**Prometheus** without OpenTelemetry: register a :class:`PrometheusCollector` with
``prometheus_client`` (names as OpenTelemetry's Prometheus exporter would give them).

Each figure has the attributes ``sequence`` (the sequence's name in lower case; ``Tickets`` for
Flickr's ``Tickets64``/``Tickets32``) and ``bits`` (32 or 64), summed over every cache of the
process that serves that sequence. Tiers of caches inside one process
(``CachedSource(CachedSource(...))``) are each counted.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._naming import max_id

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

__all__ = [
    "INSTRUMENTS",
    "METER_NAME",
    "Instrument",
    "PrometheusCollector",
    "SequenceFigures",
    "enable",
    "figures",
]

logger = logging.getLogger("sqlalchemy_tickets")

#: The OpenTelemetry meter name (also the instrumentation scope).
METER_NAME = "sqlalchemy_tickets"


@dataclass(frozen=True)
class SequenceFigures:
    """What the caches of this process know about one ``(sequence, bits)``, right now."""

    sequence: str
    bits: int
    #: Ids handed to callers (``next_id`` and ``next_block``), by open and closed caches.
    issued: int
    #: Ids given up unused when caches closed (a restart's waste).
    burned: int
    #: Ids caches gave back to their source when they closed (not burned: issued again).
    given_back: int
    #: Ids held in memory now: the most a crash would burn.
    in_hand: int
    #: Calls that found the cache empty and waited for a round trip.
    blocking_waits: int
    #: Blocks taken from upstream.
    round_trips: int
    #: Refills that failed in a row, now (0 once a refill works again).
    refill_failures: int
    #: Recent request rate, ids per second.
    rate: float
    #: The highest id handed out.
    last_issued: int
    #: Times a database went back in time under this sequence, as sources of this process
    #: saw it (a restore, a promoted replica, a sequence below ids in use): healed or refused.
    rewinds: int = 0

    @property
    def space_used(self) -> float:
        """Share (0 to 1) of the sequence's id space below the highest id handed out."""
        return self.last_issued / max_id(self.bits)

    @property
    def attributes(self) -> dict[str, str | int]:
        """The metric attributes: ``sequence`` and ``bits``."""
        return {"sequence": self.sequence, "bits": self.bits}


def figures() -> list[SequenceFigures]:
    """Read every open cache (and the counters of closed ones) now, one entry per sequence."""
    from .sources._open import open_caches
    from .sources._rewind import counts

    caches, retired = open_caches()
    rewinds = counts()
    sums: dict[str, dict[str, float]] = {}
    for key, kept in retired.items():
        sums[key] = {name: float(value) for name, value in kept.items()}
    for cache in caches:
        for key, lane in cache.stats()["sequences"].items():
            total = sums.setdefault(key, {})
            for name in (
                "issued", "burned", "given_back", "round_trips", "blocking_waits", "in_hand",
                "rate",
            ):
                total[name] = total.get(name, 0) + lane[name]
            total["failures"] = max(total.get("failures", 0), lane["failures"])
            total["last_issued"] = max(total.get("last_issued", 0), lane["last_issued"])
    for key in rewinds:
        sums.setdefault(key, {})
    result = []
    for key in sorted(sums):
        sequence, _, bits = key.rpartition("/")
        total = sums[key]
        result.append(
            SequenceFigures(
                sequence=sequence,
                bits=int(bits),
                issued=int(total.get("issued", 0)),
                burned=int(total.get("burned", 0)),
                given_back=int(total.get("given_back", 0)),
                in_hand=int(total.get("in_hand", 0)),
                blocking_waits=int(total.get("blocking_waits", 0)),
                round_trips=int(total.get("round_trips", 0)),
                refill_failures=int(total.get("failures", 0)),
                rate=float(total.get("rate", 0.0)),
                last_issued=int(total.get("last_issued", 0)),
                rewinds=rewinds.get(key, 0),
            )
        )
    return result


@dataclass(frozen=True)
class Instrument:
    """One published figure: its OpenTelemetry name, kind, unit and how to read it."""

    name: str
    kind: str  # "counter" or "gauge"
    unit: str
    description: str
    read: Callable[[SequenceFigures], float]

    @property
    def prometheus_name(self) -> str:
        """The name Prometheus sees (without the ``_total`` a counter gets): OpenTelemetry's
        Prometheus exporter drops ``{annotation}`` units and spells ``/s`` ``_per_second``."""
        name = self.name.replace(".", "_")
        return name + "_per_second" if self.unit.endswith("/s") else name


#: Every instrument, in the order they are registered. The first five are the contract's.
INSTRUMENTS: tuple[Instrument, ...] = (
    Instrument("tickets.ids.issued", "counter", "{id}",
               "Ids handed out by the caches of this process", lambda f: f.issued),
    Instrument("tickets.ids.burned", "counter", "{id}",
               "Ids given up unused when caches closed", lambda f: f.burned),
    Instrument("tickets.cache.in_hand", "gauge", "{id}",
               "Ids held in memory now (what a crash would burn)", lambda f: f.in_hand),
    Instrument("tickets.cache.blocking_waits", "counter", "{wait}",
               "Calls that found the cache empty and waited for a round trip",
               lambda f: f.blocking_waits),
    Instrument("tickets.source.round_trips", "counter", "{round_trip}",
               "Blocks taken from upstream sources", lambda f: f.round_trips),
    Instrument("tickets.ids.given_back", "counter", "{id}",
               "Ids caches gave back to their source on closing (issued again, not burned)",
               lambda f: f.given_back),
    Instrument("tickets.cache.refill_failures", "gauge", "{failure}",
               "Refills that failed in a row, now (0 once one works)",
               lambda f: f.refill_failures),
    Instrument("tickets.cache.rate", "gauge", "{id}/s",
               "Recent request rate of the caches", lambda f: f.rate),
    Instrument("tickets.ids.space_used", "gauge", "1",
               "Share of the id space below the highest id handed out", lambda f: f.space_used),
    Instrument("tickets.rewinds", "counter", "{rewind}",
               "Times a database went back in time under the sequence (healed or refused)",
               lambda f: f.rewinds),
)


# -- OpenTelemetry ------------------------------------------------------------------------------

_lock = threading.Lock()
_auto_checked = False
_global_enabled = False
_providers: weakref.WeakSet[Any] = weakref.WeakSet()


def _callback(instrument: Instrument) -> Callable[[CallbackOptions], Iterator[Observation]]:
    from opentelemetry.metrics import Observation

    def observe(options: CallbackOptions) -> Iterator[Observation]:
        for entry in figures():
            yield Observation(instrument.read(entry), entry.attributes)

    return observe


def enable(meter_provider: MeterProvider | None = None) -> bool:
    """Register the instruments with OpenTelemetry; returns ``False`` if it is not installed.

    ``meter_provider``: where to register them (default: the global provider, which the first
    :class:`~sqlalchemy_tickets.CachedSource` of a process registers with by itself). Registering
    twice with one provider does nothing the second time.
    """
    global _global_enabled
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError:
        return False
    with _lock:
        if meter_provider is None:
            if _global_enabled:
                return True
            _global_enabled = True
            meter = otel_metrics.get_meter(METER_NAME, _version())
        else:
            if meter_provider in _providers:
                return True
            _providers.add(meter_provider)
            meter = meter_provider.get_meter(METER_NAME, _version())
    for instrument in INSTRUMENTS:
        make = (
            meter.create_observable_counter
            if instrument.kind == "counter"
            else meter.create_observable_gauge
        )
        make(
            instrument.name,
            callbacks=[_callback(instrument)],
            unit=instrument.unit,
            description=instrument.description,
        )
    return True


def enable_if_installed() -> None:
    """Register with the global provider once per process, if OpenTelemetry is installed.

    Called when the process's first cache opens (the package's hook in ``_open``); costs one
    look-up of the package (no import) when it is not installed.
    """
    global _auto_checked
    if _auto_checked:
        return
    with _lock:
        if _auto_checked:
            return
        _auto_checked = True
    if os.environ.get("SQLALCHEMY_TICKETS_METRICS", "").strip().lower() in {"0", "off", "no"}:
        return
    try:
        installed = importlib.util.find_spec("opentelemetry.metrics") is not None
    except (ImportError, ValueError):
        installed = False
    if installed:
        try:
            enable()
        except Exception:  # metrics must never stop a cache from working
            logger.exception("registering sqlalchemy_tickets metrics with OpenTelemetry failed")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sqlalchemy-tickets")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


# -- Prometheus ---------------------------------------------------------------------------------


class PrometheusCollector:
    """A ``prometheus_client`` collector of the same figures, read at scrape time.

    ``prometheus_client.REGISTRY.register(PrometheusCollector())`` and the application's
    ``/metrics`` (or ``prometheus_client.start_http_server``) shows ``tickets_ids_issued_total``,
    ``tickets_cache_in_hand`` ... with the labels ``sequence`` and ``bits``: the names
    OpenTelemetry's Prometheus exporter gives the same instruments.
    """

    def describe(self) -> Iterable[Any]:
        """The metric families, without samples (for the registry's duplicate check)."""
        return self._families([])

    def collect(self) -> Iterable[Any]:
        """The metric families with one sample per sequence, read now."""
        return self._families(figures())

    @staticmethod
    def _families(entries: list[SequenceFigures]) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: list[Any] = []
        for instrument in INSTRUMENTS:
            kind = CounterMetricFamily if instrument.kind == "counter" else GaugeMetricFamily
            family = kind(instrument.prometheus_name, instrument.description,
                          labels=["sequence", "bits"])
            for entry in entries:
                family.add_metric([entry.sequence, str(entry.bits)], instrument.read(entry))
            families.append(family)
        return families
