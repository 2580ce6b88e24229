"""What callers run against the service: the gRPC client, the channel and its service config (keepalive,
retries, deadlines), the load generator and its report. The server never imports it."""
