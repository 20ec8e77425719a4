"""The lock core: the kind base, holds, the watchdog, guards, owners, keys."""
