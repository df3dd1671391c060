"""The simulated server's admin surface: Prometheus ``/metrics`` and the non-SGLang ``/sim/*`` endpoints."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from draftgen.sim.core import SimServer


class AdminApi:
    def __init__(self, sim: SimServer):
        self.sim = sim

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/metrics", self.prometheus),
            web.get("/sim/truth", self.sim_truth),
            web.get("/sim/info", self.sim_info),
        ]

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(body=self.sim.metrics.render(), content_type="text/plain", charset="utf-8")

    async def sim_truth(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", "0"))
        records = self.sim.truth.records
        return web.json_response({"records": records[since:], "next": len(records)})

    async def sim_info(self, _: web.Request) -> web.Response:
        profile = self.sim.profile
        capacity = {
            str(b): profile.tokens_per_second(b) * self.sim.config.speed / self.sim.faults.slow
            for b in (1, 8, 16, 32, 48, 64, 96, 128)
            if not profile.instant
        }
        return web.json_response(
            {
                "profile": asdict(profile),
                "speed": self.sim.config.speed,
                "faults": asdict(self.sim.faults),
                "capacity_tok_s_by_batch": capacity,
                "started": self.sim.started,
                "clock_kept": {  # wall seconds the steps should have taken and took: planned ÷ actual < 1 is late
                    "planned_s": self.sim.engine.stats.step_planned_s,
                    "actual_s": self.sim.engine.stats.step_actual_s,
                },
                "healthy": self.sim.healthy,
                "pid": os.getpid(),  # which process answers: a fleet checks that the server on its port is its own
            }
        )
