"""Development tooling of duplex, never shipped in the image: the local control plane, the demo, and launchers of
routers, engines and Redis for tests and benchmarks. Its command is `duplex-dev`."""
