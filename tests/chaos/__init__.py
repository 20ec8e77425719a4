"""The chaos suite: a bounded fault-injection run whose grant history is checked afterwards.

Run it with ``python -m tests.chaos.run [--long] [--seed N] [--server valkey|redis]``.
"""
