"""What an operator sees and sets: Prometheus metrics, the access log, tracing, API keys and their
limits, TLS, and each thread's CPU. No front door, no document, no scheduling."""
