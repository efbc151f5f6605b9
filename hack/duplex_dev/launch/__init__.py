"""Start and stop the pieces of a P-D deployment as local processes on free loopback ports: routers, simulated
engines, real vLLM engines, redis-server and the Jaeger the traces tests export to."""
