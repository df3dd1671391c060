"""draftgen sim: simulated SGLang servers for tests, CI and dry runs (see docs/simulator.md)."""

from draftgen.sim.faults import Faults, parse_faults
from draftgen.sim.fleet import FleetError, SimFleet
from draftgen.sim.profiles import PROFILES, Profile, get_profile

__all__ = ["PROFILES", "Faults", "FleetError", "Profile", "SimFleet", "get_profile", "parse_faults"]
