"""What the server said about the run, joined to what the client measured: the request-log audit,
the server's latency histograms and prefix-cache hits, the TTFT breakdown, scraped speculative
counters, and the defensive Prometheus text reader they share."""
