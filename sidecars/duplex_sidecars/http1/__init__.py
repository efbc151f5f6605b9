"""HTTP/1.1 for the router, as a leaf package: it knows nothing of prefill, decode or conversations, and the router's
domain modules never import its types (the request path works on `router.exchange.Exchange`, which the server's
`Request` satisfies, and on `router.legs`, which alone drives the client). Why the router keeps its own server and client rather than a general one: docs/architecture.md,
"The HTTP layer", with the numbers.

The server's contract (`server.FrontServer`):
* A handler gets a request whose head and whole body are in: method, path (query apart), headers under lower-case
  names (a repeated header joined with ", ", and `repeated(name)` says it came more than once). Fields of a chunked
  body's trailer are dropped: they come after the head a gateway may have checked.
* It answers these itself, and the handler never runs: a malformed request 400; an HTTP/1.1 request without Host, or
  any with two, 400; a head over 64 KiB as sent (separators counted) or with more than `Limits.max_header_fields`
  fields 431, at the first field over; a body over `Limits.max_body` 413 (as soon as Content-Length shows it); a
  head or a body not complete within its deadline from its first byte 408; a connection beyond `max_connections`
  503; a counted request beyond `max_inflight` 503 with Retry-After. All but the last close the connection. Each
  refusal other than a malformed request is reported to `Limits.on_reject`.
* Keep-alive (HTTP/1.0 and `Connection: close` honoured), pipelined requests answered in order, `100 Continue` only
  when no earlier answer is being written, an idle timeout per connection.
* Responses are whole (`respond`) or streamed chunked (`start`, `write`, `end`), with `drain` for back-pressure; a
  client that has gone makes the next write raise `ClientGone`, and so does one that has read nothing of a full write
  buffer for `Limits.write_stall_seconds` (its connection is cut, reported as write_timeout). A handler that raises
  gets a 500 (or, mid-stream, a closed connection); one that answers nothing gets a 500.

The client's contract (`client.EngineClient`):
* POST only, keep-alive connections per engine origin, TCP_NODELAY, head and body in one write; the response's status
  and headers come back first, then the body as it arrives (reading pauses at 1 MiB unread).
* `EngineConnectError`: nothing reached the engine. `EngineDisconnected`: the exchange broke off, or the engine
  answered something that is not HTTP (a response head over 64 KiB included).
* A request never goes out twice unless the caller allows it: only after a pooled connection closed with no answer at
  all, only with `resend_stale`, and the response then says so (`resent`). `max_idle` keeps a request off pooled
  connections idle for longer (so that it hardly ever meets a stale one).
"""
