"""Prometheus exposition of the simulated server, with SGLang's ``sglang:`` metric names and labels."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from draftgen.sim.engine import Engine, SimRequest

LABELS = ("model_name",)
_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
_E2E_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 2400.0)


class _EngineCollector:
    """Counters and gauges read from the engine at scrape time, so they can never drift from it."""

    def __init__(self, engine: Engine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        label = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(label, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(label, value)
            return family

        yield gauge("sglang:num_running_reqs", "The number of running requests.", len(self.engine.running))
        yield gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(self.engine.waiting)
        )
        yield gauge("sglang:token_usage", "The token usage.", self.engine.kv_usage())
        yield gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", stats.interval_throughput
        )
        if self.engine.profile.speculative:
            yield gauge(
                "sglang:spec_accept_length",
                "The average acceptance length of speculative decoding (last logging interval).",
                stats.interval_accept_length or 0.0,
            )
            yield counter(
                "sglang:spec_verify_calls", "Number of speculative verify calls.", stats.verify_steps_total
            )
        yield counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens_total
        )
        yield counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens_total,
        )
        yield counter("sglang:num_requests", "Number of requests processed.", stats.requests_total)
        yield counter("sglang:num_aborted_requests", "Number of requests aborted.", stats.aborted_total)


class ServerMetrics:
    def __init__(self, engine: Engine, model_name: str):
        # SGLang 0.5.23 exposes no ``*_created`` series; prometheus_client adds one per histogram unless told not
        # to (a per-process library setting, and each simulated server is its own process).
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine, model_name))  # type: ignore[arg-type]
        self.model_name = model_name
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        ).labels(model_name)
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=_ITL_BUCKETS,
            registry=self.registry,
        ).labels(model_name)
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of end-to-end request latency in seconds.",
            LABELS,
            buckets=_E2E_BUCKETS,
            registry=self.registry,
        ).labels(model_name)

    def observe_finished(self, request: SimRequest) -> None:
        if request.finished is None:
            return
        self.e2e.observe(request.finished - request.arrival)
        if request.first_token is not None:
            self.ttft.observe(request.first_token - request.arrival)
            steps = request.verify_steps
            if steps > 1 and request.emitted > 1:
                # One observation per decode step after the first, like SGLang's per-iteration ITL.
                per_token = (request.finished - request.first_token) / (request.emitted - 1)
                for _ in range(steps - 1):
                    self.itl.observe(per_token)

    def render(self) -> bytes:
        return generate_latest(self.registry)
