"""The stateful KV-aware router: OpenAI front, P-D legs, conversation store, endpoint discovery."""
