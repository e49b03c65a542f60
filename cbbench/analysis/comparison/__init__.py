"""Results held against each other: the comparison table (compare), the regression gate (gate),
the window they read (windows), and the simulator against the measured run (sim_error)."""
