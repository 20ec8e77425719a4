"""The public surface is explicit: a change to it must be deliberate."""

from __future__ import annotations

from pathlib import Path

import aiolock
from aiolock import errors


def test_all_is_pinned() -> None:
    assert sorted(aiolock.__all__) == [
        "AsyncCountDownLatch",
        "AsyncFairLock",
        "AsyncRLock",
        "AsyncReadLock",
        "AsyncReadWriteLock",
        "AsyncSemaphore",
        "AsyncSpinLock",
        "AsyncWriteLock",
        "Client",
        "ClientStatistics",
        "CompositeStatistics",
        "LockError",
        "LockGuard",
        "LockLostError",
        "LockNotOwnedError",
        "LockStatistics",
        "LockSyncError",
        "LockTimeoutError",
        "MultiLock",
        "Permit",
        "RedLock",
    ]
    for name in aiolock.__all__:
        assert getattr(aiolock, name) is not None


def test_error_tree() -> None:
    assert issubclass(errors.LockError, Exception)
    assert issubclass(errors.LockTimeoutError, errors.LockError)
    assert issubclass(errors.LockTimeoutError, TimeoutError)
    assert issubclass(errors.LockNotOwnedError, errors.LockError)
    assert issubclass(errors.LockLostError, errors.LockError)
    assert aiolock.LockLostError is errors.LockLostError
    assert issubclass(errors.LockSyncError, errors.LockError)
    assert aiolock.LockSyncError is errors.LockSyncError
    assert sorted(errors.__all__) == sorted(
        ["LockError", "LockTimeoutError", "LockNotOwnedError", "LockLostError", "LockSyncError"]
    )


def test_py_typed_is_shipped() -> None:
    from importlib import resources

    assert resources.files("aiolock").joinpath("py.typed").is_file()


def test_every_script_has_a_header() -> None:
    from aiolock import _scripts

    scripts = [value for value in vars(_scripts).values() if isinstance(value, _scripts.Script)]
    folder = Path(aiolock.__file__).parent / "scripts"
    files = [path for path in folder.glob("*/*.lua") if not path.name.startswith("_")]
    assert len(scripts) == len(files) >= 4  # every file is loaded, once
    for script in scripts:
        head = script.source.splitlines()[:16]
        assert any("KEYS[" in line for line in head), script.name
        assert any("Returns" in line for line in script.source.splitlines()), script.name
        assert len(script.sha) == 40
        assert "--@include" not in script.source


def test_sync_all_is_pinned() -> None:
    import aiolock.sync

    assert sorted(aiolock.sync.__all__) == [
        "Client",
        "CountDownLatch",
        "Guard",
        "Lock",
        "MultiLock",
        "Permit",
        "ReadWriteLock",
        "RedLock",
        "Semaphore",
    ]
    for name in aiolock.sync.__all__:
        assert getattr(aiolock.sync, name) is not None
