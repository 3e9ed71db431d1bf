"""Task stores: where task records, idempotency claims and poison keys live."""

from aiqsim.stores.base import StoreCorruptError, TaskStore, claim_owner
from aiqsim.stores.memory import MemoryStore

__all__ = ["MemoryStore", "StoreCorruptError", "TaskStore", "claim_owner"]
