"""`duplex preflight`: an engine pod's init container that proves the fabric the spec promises is there, before
vLLM starts and silently falls back to TCP (or hangs) when it is not.

Checks, in order (one module each; the file-based ones read under --root, the NIXL ones run live in this pod):

    efa_devices    /dev/infiniband/uverbs* count vs --efa-devices      efa_devices.py
    libfabric_efa  `fi_info -p efa`, else libfabric's files            libfabric.py
    hugepages      2 MiB pool, free pages, hugetlb cgroup limit        hugepages.py
    memlock        CAP_IPC_LOCK effective or RLIMIT_MEMLOCK            memlock.py
    fabric_env     FI_PROVIDER, UCX on EFA, LD_LIBRARY_PATH order      fabric_env.py
    nixl_backend   NIXL agent with --backend (child process)           nixl_checks.py, nixl_probe.py
    loopback       verified NIXL READs between two agents, GB/s floor  nixl_checks.py, nixl_probe.py

The operator's seam
-------------------
Command line to render, from the spec (`network.efa`, `kvTransfer.backend`):

    duplex preflight --backend LIBFABRIC --efa-devices <efa.devicesPerPod> --hugepages <efa.hugepages2Mi>
    duplex preflight --backend UCX                                  # EFA off: the EFA checks report `skip`

The init container must look like the engine container to the checks:
- the same resources: vpc.amazonaws.com/efa and hugepages-2Mi in requests and limits (the kubelet hands an init
  container's devices on to the app containers);
- the same securityContext and user: IPC_LOCK is effective only for root, so the duplex image's user 65532 would
  fail memlock on behalf of an engine that runs as root;
- the same env (FI_*, LD_LIBRARY_PATH, UCX_*);
- for libfabric_efa, nixl_backend and loopback to speak for the engine, the engine image's libraries. The package
  needs only the standard library until it loads NIXL, so `python3 -m duplex_sidecars.preflight` runs in the engine
  image once the package is on its PYTHONPATH (e.g. copied into a shared emptyDir by a first init container of the
  duplex image). Run from the duplex image instead, the pod-level checks still hold but the NIXL ones test the
  duplex image's NIXL (which has no libfabric).
It needs memory for two --size buffers (default 64Mi each) plus NIXL, writes only under $TMPDIR, and reads back
through `terminationMessagePolicy: File` (the default).

Exit code 0: no check failed (with --strict: none warned either); 1 otherwise; 2: bad arguments. The kubelet keeps
at most 4096 bytes of /dev/termination-log, read back from
`status.initContainerStatuses[].state.terminated.message` (or `lastState` after a restart). This package writes
at most 2048 bytes of compact JSON there:

    {"version": 1,                      # REPORT_VERSION; bump on an incompatible change
     "ok": false,                       # what the exit code says
     "backend": "LIBFABRIC",
     "checks": [{"name": "efa_devices", "status": "fail",       # pass | fail | warn | skip
                 "value": "0 of 16",                            # what was measured
                 "message": "found 0 of 16 EFA devices ..."},   # fail/warn only: what to fix
                {"name": "loopback", "status": "skip", "value": "not run"}, ...]}

Messages (then values) are shortened, the longest first, when the document would exceed the budget. A
`FabricReady` condition maps directly: status = ok, reason = the first failed check's name, message = its message.
The full report (stdout, or --json PATH) has the same shape plus `strict`, `counts`, `elapsed_s`, every check's
message and its numbers under `data` (e.g. loopback: gbps, transfer_ms_p50, small_read_us_p50, verified).
"""
