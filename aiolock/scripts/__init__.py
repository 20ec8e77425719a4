"""The Lua scripts aiolock runs, one per operation; loaded by :mod:`aiolock._scripts`."""
