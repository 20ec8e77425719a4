"""The Redis boundary: script calls, Cluster routing, pub/sub."""
