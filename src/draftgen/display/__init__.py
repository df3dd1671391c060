"""How results are shown to a person: durations in human units, progress bars, saved figures."""
