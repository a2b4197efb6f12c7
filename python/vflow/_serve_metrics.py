"""vflow serve's /metrics in Prometheus text (prometheus_client): per
served flow, the engine's state (requests running and waiting, KV pages
used and free, the prefix cache's hit rate, the share of blocks decode
attention attended) read from each engine's last stats at scrape time, and
the server's own counters and latency histograms (time to first token, time
per output token)."""

from __future__ import annotations

import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                    0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class _EngineCollector:
    """Gauges from each EngineLoop's stats, collected at scrape time."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauges = {
            "running": ("vflow_requests_running", "Requests running"),
            "waiting": ("vflow_requests_waiting", "Requests waiting"),
            "pages_used": ("vflow_kv_pages_used", "KV pages in use"),
            "pages_free": ("vflow_kv_pages_free", "KV pages free"),
            "hit_rate": ("vflow_prefix_cache_hit_rate",
                         "Prefix cache hits per query"),
            "attended": ("vflow_attended_block_share",
                         "Share of the available blocks decode attended"),
        }
        families = {k: GaugeMetricFamily(name, doc, labels=["flow"])
                    for k, (name, doc) in gauges.items()}
        for flow, loop in self.server.loops.items():
            s = loop.stats()
            values = dict(
                running=s["running"], waiting=loop.waiting(),
                pages_used=s["pages_used"],
                pages_free=s["pages_total"] - s["pages_used"],
                hit_rate=s["prefix_hits"] / max(1, s["prefix_queries"]),
                attended=s["blocks_attended"] / max(1, s["blocks_available"]))
            for key, family in families.items():
                family.add_metric([flow], float(values[key]))
        yield from families.values()


class Metrics:
    def __init__(self, server: Any) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(server))
        self.prompt_tokens = Counter(
            "vflow_prompt_tokens", "Prompt tokens of requests admitted",
            ["flow"], registry=self.registry)
        self.generation_tokens = Counter(
            "vflow_generation_tokens", "Tokens generated", ["flow"],
            registry=self.registry)
        self.requests = Counter(
            "vflow_requests", "Requests finished", ["flow", "finish_reason"],
            registry=self.registry)
        self.ttft = Histogram(
            "vflow_time_to_first_token_seconds", "Time to first token",
            ["flow"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram(
            "vflow_time_per_output_token_seconds",
            "Time per output token after the first", ["flow"],
            buckets=_LATENCY_BUCKETS, registry=self.registry)

    def on_admit(self, flow: str, prompt_tokens: int) -> None:
        self.prompt_tokens.labels(flow).inc(prompt_tokens)

    def on_tokens(self, req: Any, payload: Any, kind: str,
                  flow: str) -> None:
        """An engine event of `req`: its tokens, or its end."""
        now = time.monotonic()
        tokens = payload[0] if kind == "tokens" else payload[0][0]
        if tokens:
            self.generation_tokens.labels(flow).inc(len(tokens))
            if getattr(req, "first_token", None) is None:
                req.first_token = now
                self.ttft.labels(flow).observe(now - req.arrival)
            req.generated = getattr(req, "generated", 0) + len(tokens)
        if kind == "done":
            self.requests.labels(flow, payload[1]).inc()
            first = getattr(req, "first_token", None)
            if first is not None and req.generated > 1:
                self.tpot.labels(flow).observe(
                    (now - first) / (req.generated - 1))

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
