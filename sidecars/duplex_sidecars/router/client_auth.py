"""Client API keys: when they are configured, every completion request must present one (`Authorization: Bearer
<key>`, or Anthropic's `x-api-key`), and its tenant is the key's name, not a digest of the header.

The keys are files in a directory, one per tenant (the file's name is the tenant, its content the key): a mounted
Secret, whose updates the router picks up without a restart. A presented key is compared with every known key in
constant time, so neither whether a key exists nor which one matched shows in the answer's timing.
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 4096


class ClientKeys:
    def __init__(self, directory: str):
        self.directory = Path(directory)
        self._keys: list[tuple[str, bytes]] = []
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self.refresh()

    def _listing(self) -> tuple[tuple[str, int, int], ...]:
        out = []
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except OSError as exc:
            log.error("client keys: cannot read %s: %s", self.directory, exc)
            return ()
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file():  # a mounted Secret's ..data and ..timestamp dirs
                continue
            st = entry.stat()
            out.append((entry.name, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def refresh(self) -> bool:
        """Reread the keys when the directory changed; True when it did. A key file that cannot be read leaves its
        tenant without a key until it can (never with a stale one), and is tried again on the next call."""
        listing = self._listing()
        if listing == self._stamp:
            return False
        keys = []
        complete = True
        for name, _, size in listing:
            if size > MAX_KEY_BYTES:
                log.error("client keys: %s is larger than %d bytes; ignored", name, MAX_KEY_BYTES)
                continue
            try:
                key = (self.directory / name).read_bytes().strip()
            except OSError as exc:  # e.g. gone between the listing and the read, as a Secret's files are swapped
                log.error("client keys: cannot read %s (its tenant has no key until it can be): %s", name, exc)
                complete = False
                continue
            if key:
                keys.append((name, key))
        self._keys, self._stamp = keys, listing if complete else None
        log.info("client keys: %d tenant(s) from %s", len(keys), self.directory)
        return True

    def __len__(self) -> int:
        return len(self._keys)

    def tenant_for(self, presented: str | None) -> str | None:
        """The tenant whose key this is, or None. Every key is compared, matched or not."""
        if not presented:
            return None
        given = presented.encode("utf-8", "surrogatepass")
        found = None
        for name, key in self._keys:
            if hmac.compare_digest(given, key) and found is None:
                found = name
        return found


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key a request presents: a Bearer token, or Anthropic's x-api-key header."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return api_key.strip() if api_key else None
