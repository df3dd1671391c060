"""Shared pytest fixtures. Each block names its owner's topic; add yours in a block of its own.

Simulator fixtures (tests/test_sim_*.py and anyone who needs a server):
  * ``sim_fleet`` — a factory: ``fleet = sim_fleet(servers=1, profile="instant", faults=[...])`` returns a
    started ``SimFleet`` (healthy unless ``wait=`` says otherwise); every fleet it made is stopped and its
    files removed when the test ends, pass or fail.
  * ``shared_sim_fleet`` — one session-wide fleet of three b200-mtp servers at speed 50, speaking the three
    SGLang response shapes: ``urls[0]`` 0.5.4, ``urls[1]`` 0.5.9, ``urls[2]`` 0.5.23 (the default shape).
    For tests that only send requests; never kill or restart it, and measure its counters as differences.
  * ``instant_fleet`` — ``instant_fleet(servers=1)``: the first one or two servers of the worker's healthy
    ``instant`` fleet (the default tool-call parser, no faults), as a ``sim_helpers.FleetView`` that sees only the
    ground truth recorded since it was taken, taken once the servers are idle. For tests that only need *a* healthy
    instant fleet to send requests to: it saves starting servers (about 0.3 CPU-seconds each) in every such test.
  * ``sim_tokenizer_dir`` / ``sim_tokenizer`` — the tiny Qwen3-format tokenizer every simulated server here
    speaks (built once per session; both fleet fixtures use it), as a folder and as the simulator's own
    ``SimTokenizer``, so a test computes prompt ids, token counts and the EOS id exactly as the servers do.

Tokenizer fixtures (validate and mask tests):
  * ``tokenizer_dir`` / ``tokenizer`` — that same tiny tokenizer as a folder validate loads and as the
    ``transformers`` tokenizer ``load_tokenizer`` returns (rows built from a simulated run's ids match it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from long_first import long_first
from sim_helpers import FleetView

from draftgen.sim import SimFleet
from draftgen.sim.tokenizer import SimTokenizer, default_tokenizer

SHARED_SIM_SHAPES = ("0.5.4", "0.5.9", "0.5.23")


@pytest.fixture(scope="session")
def sim_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return default_tokenizer(tmp_path_factory.mktemp("sim-tokenizer"))


@pytest.fixture(scope="session")
def sim_tokenizer(sim_tokenizer_dir: Path) -> SimTokenizer:
    return SimTokenizer(sim_tokenizer_dir)


@pytest.fixture(scope="session")
def tokenizer_dir(sim_tokenizer_dir: Path) -> Path:
    return sim_tokenizer_dir


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from draftgen.training.masks import load_tokenizer

    return load_tokenizer(tokenizer_dir)


@pytest.fixture
def sim_fleet(
    tmp_path_factory: pytest.TempPathFactory, sim_tokenizer_dir: Path
) -> Iterator[Callable[..., SimFleet]]:
    made: list[SimFleet] = []

    def make(*, wait: str = "healthy", timeout: float = 60.0, **options: object) -> SimFleet:
        options.setdefault("servers", 1)
        options.setdefault("tokenizer", sim_tokenizer_dir)
        options.setdefault("work_dir", tmp_path_factory.mktemp("sim"))
        fleet = SimFleet(**options)  # type: ignore[arg-type]
        made.append(fleet)
        fleet.start(wait=wait, timeout=timeout)
        return fleet

    yield make
    for fleet in made:
        fleet.cleanup()


@pytest.fixture(scope="session")
def shared_sim_fleet(tmp_path_factory: pytest.TempPathFactory, sim_tokenizer_dir: Path) -> Iterator[SimFleet]:
    fleet = SimFleet(
        tokenizer=sim_tokenizer_dir,
        servers=len(SHARED_SIM_SHAPES),
        profile="b200-mtp",
        speed=50.0,
        per_server_faults={i: [f"sglang_version={shape}"] for i, shape in enumerate(SHARED_SIM_SHAPES)},
        work_dir=tmp_path_factory.mktemp("shared-sim"),
    )
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.cleanup()


@pytest.fixture(scope="session")
def _shared_instant_fleet(
    tmp_path_factory: pytest.TempPathFactory, sim_tokenizer_dir: Path
) -> Iterator[SimFleet]:
    fleet = SimFleet(
        tokenizer=sim_tokenizer_dir,
        servers=2,
        profile="instant",
        work_dir=tmp_path_factory.mktemp("shared-instant"),
    )
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.cleanup()


@pytest.fixture
def instant_fleet(_shared_instant_fleet: SimFleet) -> Callable[..., FleetView]:
    def view(servers: int = 1) -> FleetView:
        return FleetView(_shared_instant_fleet, servers)

    return view


# ----- the order of the first pass (tests/long_first.py) ------------------------------------------------------
@pytest.hookimpl(trylast=True)  # after -m has deselected: the blocks are those of the tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    modules = [item.nodeid.split("::")[0] for item in items]
    per_module = {module: modules.count(module) for module in set(modules)}

    def weight(item: pytest.Item, module: str) -> float:
        """``slow(n)``: as long as n long tests (default 1); a module marked as a whole shares its n."""
        mark = item.get_closest_marker("slow")
        if mark is None:
            return 0.0
        runs = float(mark.args[0]) if mark.args else 1.0
        return runs if mark in item.own_markers else runs / per_module[module]

    items[:] = long_first(
        items, [weight(i, m) for i, m in zip(items, modules, strict=True)], modules, workers
    )
