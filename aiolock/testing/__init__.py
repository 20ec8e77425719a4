"""Test support: embedded servers and the pytest plugin (as ``trio.testing``)."""
