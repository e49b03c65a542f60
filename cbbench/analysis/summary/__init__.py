"""A run's summary figures from its records: latency distributions (metrics, percentiles,
histogram), the steady-state window, time slices, turns, SLO attainment, splits by model and
endpoint, token counts, inputs, speculative decoding, telemetry, intervals and deployment."""
