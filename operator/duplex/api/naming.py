"""Rules on the object's own name: child names append a role suffix and must stay valid Service names."""

from __future__ import annotations

import re

from duplex.api.rules import Rule

MAX_NAME = 55  # 63 (DNS-1035 label) minus len("-prefill")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

NAME_RULE = Rule(
    cel=f"self.metadata.name.size() <= {MAX_NAME} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    message=f"metadata.name must be a DNS-1035 label of at most {MAX_NAME} characters "
    "(children are named <name>-prefill, <name>-decode, <name>-router)",
    holds=lambda name: len(name) <= MAX_NAME and bool(_NAME_RE.match(name)),
)
