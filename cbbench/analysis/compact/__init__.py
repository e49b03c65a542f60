"""A simulated run held as columns (compact_run) and its summary computed on them: the array
simulator's path, checked against the object path's (compact_convert)."""
