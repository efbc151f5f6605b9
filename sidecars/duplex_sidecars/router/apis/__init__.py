"""The client APIs the router serves through prefill and decode, each declared once as an `Api` (api.py): its path,
what a body must have, how its history and scope are read, how each leg is shaped, how decode's answer is read back
into a reply, how its streams end and what its errors look like. The pipeline knows no API by name.

Add an API by writing one module with its `Api` and listing it in `APIS`.
"""

from __future__ import annotations

from duplex_sidecars.router.apis import anthropic, openai, responses
from duplex_sidecars.router.apis.api import Api

APIS: dict[str, Api] = {api.path: api for api in (openai.CHAT, openai.COMPLETIONS, responses.API, anthropic.API)}
