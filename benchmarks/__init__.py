"""aiolock's benchmarks against its peers: ``python benchmarks/run.py --help``."""
