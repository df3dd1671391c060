"""The benchmark: per-server throughput, latency and speculative-decoding acceptance at each concurrency."""
