"""The estimate: days, GPU-hours and dollars for the whole prompt set, from a benchmark of the fleet."""
